//! The `lowering_kernels` (tiles changing layout between ops, reductions across warps) on
//! the GPU, compiled for sm_80 and, on Hopper, sm_90a: against the f64 reference and the
//! interpreter, shapes that are no multiple of the tiles, every input distribution, outputs
//! poisoned with NaN, inputs with padded row strides. Skips itself without a GPU.

mod gpu_common;
mod lowering_kernels;

use std::process::ExitCode;

use gpu_common::{Needs, check, devices, poisoned_output as output, upload_padded};
use kiln_ir::dsl::KernelDef;
use kiln_ir::{DType, HostTensor};
use kiln_tests::check::{Case, poisoned, sum_tolerance, tolerance};
use kiln_tests::inputs::{Dist, Rng, tensor};
use lowering_kernels::*;

fn gpu_block_counts() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        for (bn, bins) in [(64, 128), (128, 32)] {
            let c = BlockCountsComptime { BN: bn, BINS: bins };
            for n in [1, 100, 1000, 4097] {
                let data = HostTensor::from_fn(&[n], DType::I32, |_| {
                    rng.uniform(-8.0, bins as f64 + 8.0).floor()
                });
                let grid = block_counts.grid(&c, [n, 1, 1]);
                let len = n.div_ceil(bn) * bins;
                let out = output(&dev, DType::I32, &[len]);
                let dd = dev.upload(&data).expect("upload");
                block_counts
                    .launch(&dev, &c, grid, &dd, &out)
                    .expect("launch");
                let mut oi = poisoned(&[len], DType::I32);
                block_counts
                    .interpret(&c, grid, &data, &mut oi)
                    .expect("interpret");
                let case = Case {
                    kernel: format!("block_counts BN={bn} BINS={bins} on {}", dev.target()),
                    shape: format!("n={n}"),
                    dist: Dist::Uniform,
                    seed: rng.seed(),
                };
                check(&case, &out, &block_counts_ref(&data, bn, bins), &oi, 0.0);
            }
        }
    }
}

fn gpu_scale_rows() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        for (bm, bn) in [(64, 64), (32, 128)] {
            let c = ScaleRowsComptime { BM: bm, BN: bn };
            for (m, n) in [(1, 1), (70, 130), (129, 64)] {
                for dist in Dist::ALL {
                    let x = tensor(&mut rng, &[m, n], DType::F32, dist);
                    let w = tensor(&mut rng, &[m], DType::F32, dist);
                    let grid = scale_rows.grid(&c, [m, 1, 1]);
                    let y = output(&dev, DType::F32, &[m, n]);
                    let (dx, dw) = (upload_padded(&dev, &x, 3), dev.upload(&w).expect("upload"));
                    scale_rows
                        .launch(&dev, &c, grid, &dx, &dw, &y)
                        .expect("launch");
                    let mut yi = poisoned(&[m, n], DType::F32);
                    scale_rows
                        .interpret(&c, grid, &x, &w, &mut yi)
                        .expect("interpret");
                    let case = Case {
                        kernel: format!("scale_rows BM={bm} BN={bn} on {}", dev.target()),
                        shape: format!("m={m} n={n}"),
                        dist,
                        seed: rng.seed(),
                    };
                    let tol = tolerance(DType::F32);
                    check(&case, &y, &scale_rows_ref(&x, &w), &yi, tol);
                }
            }
        }
    }
}

fn gpu_row_stats() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        for (bm, bn) in [(1, 2048), (1, 4096), (4, 512)] {
            let c = RowStatsComptime { BM: bm, BN: bn };
            for (m, n) in [(1, 1), (3, 5000), (5, 2048), (64, 3000)] {
                for dist in Dist::ALL {
                    let x = tensor(&mut rng, &[m, n], DType::F32, dist);
                    let grid = row_stats.grid(&c, [m, 1, 1]);
                    let (s, mx) = (
                        output(&dev, DType::F32, &[m]),
                        output(&dev, DType::F32, &[m]),
                    );
                    let dx = upload_padded(&dev, &x, 1);
                    row_stats
                        .launch(&dev, &c, grid, &dx, &s, &mx)
                        .expect("launch");
                    let (mut si, mut mi) = (poisoned(&[m], DType::F32), poisoned(&[m], DType::F32));
                    row_stats
                        .interpret(&c, grid, &x, &mut si, &mut mi)
                        .expect("interpret");
                    let (rs, rm) = row_stats_ref(&x);
                    let case = Case {
                        kernel: format!("row_stats BM={bm} BN={bn} on {}", dev.target()),
                        shape: format!("m={m} n={n}"),
                        dist,
                        seed: rng.seed(),
                    };
                    check(&case, &s, &rs, &si, sum_tolerance(n));
                    check(&case, &mx, &rm, &mi, 0.0);
                }
            }
        }
    }
}

fn gpu_row_sums_half() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        for dtype in [DType::Bf16, DType::F16] {
            for (bm, bn) in [(1, 2048), (4, 512)] {
                let c = RowSumsHalfComptime {
                    BM: bm,
                    BN: bn,
                    dtype,
                };
                for (m, n) in [(1, 1), (3, bn - 5), (65, bn)] {
                    for dist in Dist::ALL {
                        let x = tensor(&mut rng, &[m, n], dtype, dist);
                        let grid = row_sums_half.grid(&c, [m, 1, 1]);
                        let out = output(&dev, dtype, &[m]);
                        let dx = upload_padded(&dev, &x, 8);
                        row_sums_half
                            .launch(&dev, &c, grid, &dx, &out)
                            .expect("launch");
                        let mut oi = poisoned(&[m], dtype);
                        row_sums_half
                            .interpret(&c, grid, &x, &mut oi)
                            .expect("interpret");
                        let case = Case {
                            kernel: format!(
                                "row_sums_half {dtype} BM={bm} BN={bn} on {}",
                                dev.target()
                            ),
                            shape: format!("m={m} n={n}"),
                            dist,
                            seed: rng.seed(),
                        };
                        check(&case, &out, &row_stats_ref(&x).0, &oi, tolerance(dtype));
                    }
                }
            }
        }
    }
}

fn gpu_col_sums() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        for (bm, bn) in [(256, 32), (128, 8)] {
            let c = ColSumsComptime { BM: bm, BN: bn };
            for (m, n) in [(1, 1), (1000, 33), (256, 64), (3001, 300)] {
                for dist in Dist::ALL {
                    let x = tensor(&mut rng, &[m, n], DType::F32, dist);
                    let grid = col_sums.grid(&c, [n, 1, 1]);
                    let out = output(&dev, DType::F32, &[n]);
                    let dx = upload_padded(&dev, &x, 5);
                    col_sums.launch(&dev, &c, grid, &dx, &out).expect("launch");
                    let mut oi = poisoned(&[n], DType::F32);
                    col_sums
                        .interpret(&c, grid, &x, &mut oi)
                        .expect("interpret");
                    let case = Case {
                        kernel: format!("col_sums BM={bm} BN={bn} on {}", dev.target()),
                        shape: format!("m={m} n={n}"),
                        dist,
                        seed: rng.seed(),
                    };
                    check(&case, &out, &col_sums_ref(&x), &oi, sum_tolerance(m));
                }
            }
        }
    }
}

fn main() -> ExitCode {
    gpu_common::run(&[
        ("gpu_lowering_block_counts", Needs::Gpu, gpu_block_counts),
        ("gpu_lowering_scale_rows", Needs::Gpu, gpu_scale_rows),
        ("gpu_lowering_row_stats", Needs::Gpu, gpu_row_stats),
        ("gpu_lowering_col_sums", Needs::Gpu, gpu_col_sums),
        ("gpu_lowering_row_sums_half", Needs::Gpu, gpu_row_sums_half),
    ])
}
