//! The `large_tiles_kernels` (one tile of up to 65536 elements a row, streamed in chunks by
//! the `strip_mine` pass) on the GPU, for sm_80 and, on Hopper, sm_90a: against the f64
//! reference and the interpreter, shapes no multiple of the tiles, every input
//! distribution, outputs poisoned with NaN, inputs with padded row strides. Skips itself
//! without a GPU.

mod gpu_common;
mod large_tiles_kernels;

use std::process::ExitCode;

use gpu_common::{Needs, check, devices, poisoned_output as output, upload_padded};
use kiln_ir::dsl::KernelDef;
use kiln_ir::{DType, HostTensor};
use kiln_tests::check::{Case, assert_close, poisoned, sum_tolerance, tolerance};
use kiln_tests::inputs::{Dist, Rng, tensor};
use kiln_tests::sweep::sweep;
use large_tiles_kernels::*;

/// `out` against `reference` relative to the input's norm: a centred matrix can be all but
/// zero (an all-equal input), so the error of its means is measured against `x`.
fn assert_centered(case: &Case, out: &HostTensor, reference: &[f64], x: &HostTensor, tol: f64) {
    let o = out.to_f64_vec();
    let diff: f64 = o
        .iter()
        .zip(reference)
        .map(|(a, b)| (a - b) * (a - b))
        .sum::<f64>()
        .sqrt();
    let norm = x.to_f64_vec().iter().map(|a| a * a).sum::<f64>().sqrt();
    let err = if norm == 0.0 { diff } else { diff / norm };
    assert!(
        err <= tol,
        "{case}: error {err:e} relative to the input exceeds {tol:e}"
    );
}

/// A shape `(m, n)` as the failure messages write it.
fn m_n((m, n): (usize, usize)) -> String {
    format!("m={m} n={n}")
}

fn gpu_softmax() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        for (bm, bn) in [(1, 16384), (2, 32768), (1, 65536)] {
            let c = WholeRowSoftmaxComptime { BM: bm, BN: bn };
            let shapes = [(1, 1), (3, bn / 2 + 77), (bm + 5, bn)];
            let kernel = format!("whole_row_softmax BM={bm} BN={bn} on {}", dev.target());
            sweep(
                &mut rng,
                &kernel,
                shapes,
                &Dist::ALL,
                m_n,
                |rng, (m, n), case| {
                    let x = tensor(rng, &[m, n], DType::F32, case.dist);
                    let grid = whole_row_softmax.grid(&c, [m, 1, 1]);
                    let y = output(&dev, DType::F32, &[m, n]);
                    let dx = upload_padded(&dev, &x, 3);
                    whole_row_softmax
                        .launch(&dev, &c, grid, &dx, &y)
                        .expect("launch");
                    let mut yi = poisoned(&[m, n], DType::F32);
                    whole_row_softmax
                        .interpret(&c, grid, &x, &mut yi)
                        .expect("interpret");
                    check(case, &y, &softmax_ref(&x), &yi, sum_tolerance(n));
                },
            );
        }
    }
}

fn gpu_layer_norm() {
    let mut rng = Rng::from_env();
    let eps = 1e-5;
    for dev in devices() {
        let c = WholeRowLayerNormComptime::default();
        let shapes = [(1, 1), (3, 20000), (5, 32768)];
        let kernel = format!("whole_row_layer_norm on {}", dev.target());
        sweep(
            &mut rng,
            &kernel,
            shapes,
            &Dist::ALL,
            m_n,
            |rng, (m, n), case| {
                let x = tensor(rng, &[m, n], DType::F32, case.dist);
                let w = tensor(rng, &[n], DType::F32, Dist::Normal);
                let b = tensor(rng, &[n], DType::F32, Dist::Normal);
                let grid = whole_row_layer_norm.grid(&c, [m, 1, 1]);
                let (y, mu, rs) = (
                    output(&dev, DType::F32, &[m, n]),
                    output(&dev, DType::F32, &[m]),
                    output(&dev, DType::F32, &[m]),
                );
                let dx = upload_padded(&dev, &x, 1);
                let dw = dev.upload(&w).expect("upload");
                let db = dev.upload(&b).expect("upload");
                whole_row_layer_norm
                    .launch(&dev, &c, grid, &dx, &dw, &db, &y, &mu, &rs, eps as f32)
                    .expect("launch");
                let mut yi = poisoned(&[m, n], DType::F32);
                let mut mi = poisoned(&[m], DType::F32);
                let mut ri = poisoned(&[m], DType::F32);
                whole_row_layer_norm
                    .interpret(&c, grid, &x, &w, &b, &mut yi, &mut mi, &mut ri, eps as f32)
                    .expect("interpret");
                let (yr, mr, rr) = layer_norm_ref(&x, &w, &b, eps);
                // See `large_tiles`: the mean's rounding is about four sums' worth.
                let tol = sum_tolerance(4 * n);
                check(case, &y, &yr, &yi, tol);
                check(case, &mu, &mr, &mi, tol);
                check(case, &rs, &rr, &ri, tol);
            },
        );
    }
}

fn gpu_row_sums() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        for dtype in [DType::F32, DType::Bf16, DType::F16] {
            let c = WholeRowSumsComptime {
                dtype,
                ..WholeRowSumsComptime::default()
            };
            // f16 rows stay where their sum fits f16 (see `large_tiles`).
            let (ns, dists) = match dtype {
                DType::F16 => ([1, 1000, 20000], &[Dist::Uniform, Dist::Normal][..]),
                _ => ([1, 1000, 65536], &Dist::ALL[..]),
            };
            let kernel = format!("whole_row_sums {dtype} on {}", dev.target());
            let label = |n: usize| format!("n={n}");
            sweep(&mut rng, &kernel, ns, dists, label, |rng, n, case| {
                let m = 3;
                let x = tensor(rng, &[m, n], dtype, case.dist);
                let grid = whole_row_sums.grid(&c, [m, 1, 1]);
                let out = output(&dev, dtype, &[m]);
                let dx = upload_padded(&dev, &x, 8);
                whole_row_sums
                    .launch(&dev, &c, grid, &dx, &out)
                    .expect("launch");
                let mut oi = poisoned(&[m], dtype);
                whole_row_sums
                    .interpret(&c, grid, &x, &mut oi)
                    .expect("interpret");
                let tol = sum_tolerance(n).max(tolerance(dtype));
                check(case, &out, &row_sums_ref(&x), &oi, tol);
            });
        }
    }
}

fn gpu_dropout() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        let c = BigDropoutComptime::default();
        for n in [1, 70000, 200_000] {
            let x = tensor(&mut rng, &[n], DType::F32, Dist::Normal);
            let (p, seed) = (0.3f32, rng.next_u64() as u32);
            let grid = big_dropout.grid(&c, [n, 1, 1]);
            let y = output(&dev, DType::F32, &[n]);
            let dx = dev.upload(&x).expect("upload");
            big_dropout
                .launch(&dev, &c, grid, &dx, &y, p, seed)
                .expect("launch");
            let mut yi = poisoned(&[n], DType::F32);
            big_dropout
                .interpret(&c, grid, &x, &mut yi, p, seed)
                .expect("interpret");
            // The mask is a function of (seed, index): the GPU draws exactly the
            // interpreter's.
            let got = y.download().expect("download").to_f64_vec();
            assert_eq!(
                got,
                yi.to_f64_vec(),
                "big_dropout n={n} on {}",
                dev.target()
            );
        }
    }
}

fn gpu_randn_sin() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        let c = BigRandnSinComptime::default();
        let shapes = [(1, 1), (70, 9000), (64, 8192)];
        let kernel = format!("big_randn_sin on {}", dev.target());
        sweep(
            &mut rng,
            &kernel,
            shapes,
            &[Dist::Normal, Dist::Large],
            m_n,
            |rng, (m, n), case| {
                let x = tensor(rng, &[m, n], DType::F32, case.dist);
                let seed = rng.next_u64() as u32;
                let grid = big_randn_sin.grid(&c, [m, n, 1]);
                let y = output(&dev, DType::F32, &[m, n]);
                let dx = upload_padded(&dev, &x, 2);
                big_randn_sin
                    .launch(&dev, &c, grid, &dx, &y, seed)
                    .expect("launch");
                let mut yi = poisoned(&[m, n], DType::F32);
                big_randn_sin
                    .interpret(&c, grid, &x, &mut yi, seed)
                    .expect("interpret");
                // randn's logarithm is the hardware's approximation: the interpreter is the
                // reference, within f32's tolerance.
                let got = y.download().expect("download");
                assert_close(case, &got, &yi.to_f64_vec(), tolerance(DType::F32));
            },
        );
    }
}

fn gpu_double_center() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        let c = DoubleCenterComptime::default();
        let shapes = [(1, 1), (50, 5000), (64, 8192), (7, 8000)];
        let kernel = format!("double_center on {}", dev.target());
        sweep(
            &mut rng,
            &kernel,
            shapes,
            &Dist::ALL,
            m_n,
            |rng, (m, n), case| {
                let x = tensor(rng, &[m, n], DType::F32, case.dist);
                let y = output(&dev, DType::F32, &[m, n]);
                let dx = upload_padded(&dev, &x, 4);
                double_center
                    .launch(&dev, &c, [1, 1, 1], &dx, &y)
                    .expect("launch");
                let mut yi = poisoned(&[m, n], DType::F32);
                double_center
                    .interpret(&c, [1, 1, 1], &x, &mut yi)
                    .expect("interpret");
                let got = y.download().expect("download");
                let tol = sum_tolerance(n.max(m));
                assert_centered(case, &got, &double_center_ref(&x), &x, tol);
                assert_centered(case, &got, &yi.to_f64_vec(), &x, tol);
            },
        );
    }
}

fn gpu_softmax_rows_loop() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        let c = SoftmaxRowsLoopComptime::default();
        let shapes = [(1, 1), (3, 20001), (2, 32768)];
        let kernel = format!("softmax_rows_loop on {}", dev.target());
        sweep(
            &mut rng,
            &kernel,
            shapes,
            &Dist::ALL,
            m_n,
            |rng, (m, n), case| {
                let x = tensor(rng, &[m, n], DType::F32, case.dist);
                let y = output(&dev, DType::F32, &[m, n]);
                let dx = upload_padded(&dev, &x, 6);
                softmax_rows_loop
                    .launch(&dev, &c, [1, 1, 1], &dx, &y)
                    .expect("launch");
                let mut yi = poisoned(&[m, n], DType::F32);
                softmax_rows_loop
                    .interpret(&c, [1, 1, 1], &x, &mut yi)
                    .expect("interpret");
                check(case, &y, &softmax_ref(&x), &yi, sum_tolerance(n));
            },
        );
    }
}

fn gpu_row_permute() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        let c = BigRowPermuteComptime::default();
        for (m, n, rows) in [(1, 1, 1), (9, 16383, 7), (40, 5000, 41)] {
            for dist in [Dist::Normal, Dist::Large] {
                let x = tensor(&mut rng, &[m, n], DType::F32, dist);
                // Each destination once, some past `y`; sources any row, some past `x`.
                let mut dst: Vec<i32> = (0..rows as i32).collect();
                for i in (1..dst.len()).rev() {
                    dst.swap(i, rng.range(0, i + 1));
                }
                let src: Vec<i32> = (0..rows).map(|_| rng.range(0, m + 2) as i32).collect();
                let index =
                    |v: &[i32]| HostTensor::from_fn(&[rows], DType::I32, |i| f64::from(v[i]));
                let (src_t, dst_t) = (index(&src), index(&dst));
                let ny = rows.saturating_sub(2).max(1);
                let grid = big_row_permute.grid(&c, [rows, 1, 1]);
                let y = output(&dev, DType::F32, &[ny, n]);
                let up = |t: &HostTensor| dev.upload(t).expect("upload");
                let dx = upload_padded(&dev, &x, 3);
                big_row_permute
                    .launch(&dev, &c, grid, &dx, &up(&src_t), &up(&dst_t), &y)
                    .expect("launch");
                let mut yi = poisoned(&[ny, n], DType::F32);
                let want = row_permute_ref(&x, &src, &dst, &yi);
                big_row_permute
                    .interpret(&c, grid, &x, &src_t, &dst_t, &mut yi)
                    .expect("interpret");
                // Rows nobody writes keep the poison: compared bit for bit, NaN as NaN.
                let same = |a: &[f64], b: &[f64]| {
                    a.iter()
                        .zip(b)
                        .all(|(p, q)| p == q || (p.is_nan() && q.is_nan()))
                };
                let got = y.download().expect("download").to_f64_vec();
                let what = format!(
                    "big_row_permute m={m} n={n} rows={rows} {dist:?} on {}",
                    dev.target()
                );
                assert!(
                    same(&got, &want),
                    "{what}: against the reference, KILN_SEED={}",
                    rng.seed()
                );
                assert!(
                    same(&got, &yi.to_f64_vec()),
                    "{what}: against the interpreter"
                );
            }
        }
    }
}

fn gpu_histogram() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        let c = BigHistogramComptime::default();
        for n in [1, 70000, 200_000] {
            for dist in [Dist::Uniform, Dist::Normal, Dist::Large] {
                let x = tensor(&mut rng, &[n], DType::F32, dist);
                let bins = 37;
                let h = dev
                    .upload(&HostTensor::full(&[bins], DType::I32, 0.0))
                    .expect("upload");
                let dx = dev.upload(&x).expect("upload");
                big_histogram
                    .launch(&dev, &c, big_histogram.grid(&c, [n, 1, 1]), &dx, &h)
                    .expect("launch");
                assert_eq!(
                    h.download().expect("download").to_f64_vec(),
                    histogram_ref(&x, bins),
                    "big_histogram n={n} {dist:?} on {}, KILN_SEED={}",
                    dev.target(),
                    rng.seed()
                );
            }
        }
    }
}

fn gpu_carried_cos_log() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        let c = CarriedCosLogComptime::default();
        let shapes = [(1, 1), (3, 20001), (5, 16384)];
        let kernel = format!("carried_cos_log on {}", dev.target());
        sweep(
            &mut rng,
            &kernel,
            shapes,
            &[Dist::Uniform, Dist::Normal, Dist::Large],
            m_n,
            |rng, (m, n), case| {
                let x = tensor(rng, &[m, n], DType::F32, case.dist);
                let grid = carried_cos_log.grid(&c, [n, 1, 1]);
                let y = output(&dev, DType::F32, &[1, n]);
                let dx = upload_padded(&dev, &x, 2);
                carried_cos_log
                    .launch(&dev, &c, grid, &dx, &y)
                    .expect("launch");
                let mut yi = poisoned(&[1, n], DType::F32);
                carried_cos_log
                    .interpret(&c, grid, &x, &mut yi)
                    .expect("interpret");
                // The called `cos` and the inline `log` are the interpreter's sequences, and
                // no multiply meets an add that ptxas could fuse: the same bits.
                let got = y.download().expect("download");
                assert_eq!(got.to_f64_vec(), yi.to_f64_vec(), "{case}");
                assert_close(case, &got, &cos_log_ref(&x), sum_tolerance(m));
            },
        );
    }
}

/// The user's loops that carry or read a streamed tile (`carried_row`, `running_blocks`,
/// `scaled_rows`: the loop runs once per chunk) against the reference and the interpreter.
fn gpu_users_loops() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        let c = CarriedRowComptime::default();
        let kernel = format!("carried_row on {}", dev.target());
        let shapes = [(1, 1), (3, 40000), (2, 65536)];
        sweep(
            &mut rng,
            &kernel,
            shapes,
            &Dist::ALL,
            m_n,
            |rng, (m, n), case| {
                let x = tensor(rng, &[m, n], DType::F32, case.dist);
                let y = output(&dev, DType::F32, &[1, n]);
                let dx = upload_padded(&dev, &x, 3);
                carried_row
                    .launch(&dev, &c, [1, 1, 1], &dx, &y)
                    .expect("launch");
                let want = carried_row_ref(&x);
                assert_close(
                    case,
                    &y.download().expect("download"),
                    &want,
                    sum_tolerance(m),
                );
            },
        );

        let c = RunningBlocksComptime::default();
        let kernel = format!("running_blocks on {}", dev.target());
        let shapes = [(1, 1), (100, 1500), (64, 1024)];
        let dists = [Dist::Uniform, Dist::Normal, Dist::Large];
        sweep(
            &mut rng,
            &kernel,
            shapes,
            &dists,
            m_n,
            |rng, (m, n), case| {
                let x = tensor(rng, &[m, n], DType::F32, case.dist);
                let grid = running_blocks.grid(&c, [n, 1, 1]);
                let y = output(&dev, DType::F32, &[m, n]);
                let dx = upload_padded(&dev, &x, 5);
                running_blocks
                    .launch(&dev, &c, grid, &dx, &y)
                    .expect("launch");
                let want = running_blocks_ref(&x, c.BM);
                let tol = sum_tolerance(m.div_ceil(c.BM));
                assert_close(case, &y.download().expect("download"), &want, tol);
            },
        );

        let c = ScaledRowsComptime::default();
        let kernel = format!("scaled_rows on {}", dev.target());
        let shapes = [(1, 1), (3, 40000), (5, 65536)];
        sweep(
            &mut rng,
            &kernel,
            shapes,
            &Dist::ALL,
            m_n,
            |rng, (m, n), case| {
                let x = tensor(rng, &[1, n], DType::F32, case.dist);
                let y = output(&dev, DType::F32, &[m, n]);
                let dx = upload_padded(&dev, &x, 2);
                scaled_rows
                    .launch(&dev, &c, [1, 1, 1], &dx, &y)
                    .expect("launch");
                let want = scaled_rows_ref(&x, m);
                assert_close(
                    case,
                    &y.download().expect("download"),
                    &want,
                    tolerance(DType::F32),
                );
            },
        );
    }
}

fn main() -> ExitCode {
    gpu_common::run(&[
        ("gpu_large_tiles_softmax", Needs::Gpu, gpu_softmax),
        ("gpu_large_tiles_layer_norm", Needs::Gpu, gpu_layer_norm),
        ("gpu_large_tiles_row_sums", Needs::Gpu, gpu_row_sums),
        ("gpu_large_tiles_dropout", Needs::Gpu, gpu_dropout),
        ("gpu_large_tiles_randn_sin", Needs::Gpu, gpu_randn_sin),
        (
            "gpu_large_tiles_double_center",
            Needs::Gpu,
            gpu_double_center,
        ),
        (
            "gpu_large_tiles_softmax_rows_loop",
            Needs::Gpu,
            gpu_softmax_rows_loop,
        ),
        ("gpu_large_tiles_row_permute", Needs::Gpu, gpu_row_permute),
        ("gpu_large_tiles_histogram", Needs::Gpu, gpu_histogram),
        (
            "gpu_large_tiles_carried_cos_log",
            Needs::Gpu,
            gpu_carried_cos_log,
        ),
        ("gpu_large_tiles_users_loops", Needs::Gpu, gpu_users_loops),
    ])
}
