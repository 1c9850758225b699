//! Kernels whose tiles change layout between ops or whose reductions span warps
//! (`lowering_kernels`): each runs on the interpreter against its f64 reference (several
//! shapes that are no multiple of the tiles, every input distribution, poisoned outputs),
//! and compiles for sm_80 and sm_90a, aligned and not, to PTX that ptxas assembles without
//! spills, with the exchange through shared memory where the layouts need one.

mod lowering_kernels;

use kiln_ir::dsl::KernelDef;
use kiln_ir::{DType, HostTensor};
use kiln_tests::check::{Case, assert_close, poisoned, sum_tolerance, tolerance};
use kiln_tests::codegen::assembles_clean;
use kiln_tests::inputs::{Dist, Rng, tensor};
use lowering_kernels::*;

const CONVERSION: &str = "layout conversion through shared memory";
const ACROSS_WARPS: &str = "reduction across warps through shared memory";

#[test]
fn block_counts_compiles_and_matches_reference() {
    for (bn, bins) in [(64, 128), (128, 32)] {
        let c = BlockCountsComptime { BN: bn, BINS: bins };
        assembles_clean(&block_counts, c, CONVERSION);
        let mut rng = Rng::from_env();
        for n in [1, 100, 1000] {
            // Values mostly in range, some below and above it.
            let data = HostTensor::from_fn(&[n], DType::I32, |_| {
                rng.uniform(-8.0, bins as f64 + 8.0).floor()
            });
            let grid = block_counts.grid(&c, [n, 1, 1]);
            let mut out = poisoned(&[n.div_ceil(bn) * bins], DType::I32);
            block_counts
                .interpret(&c, grid, &data, &mut out)
                .expect("interpret");
            let case = Case {
                kernel: format!("block_counts BN={bn} BINS={bins}"),
                shape: format!("n={n}"),
                dist: Dist::Uniform,
                seed: rng.seed(),
            };
            assert_close(&case, &out, &block_counts_ref(&data, bn, bins), 0.0);
        }
    }
}

#[test]
fn scale_rows_compiles_and_matches_reference() {
    for (bm, bn) in [(64, 64), (32, 128)] {
        let c = ScaleRowsComptime { BM: bm, BN: bn };
        assembles_clean(&scale_rows, c, CONVERSION);
        let mut rng = Rng::from_env();
        for (m, n) in [(1, 1), (70, 130), (129, 64)] {
            for dist in Dist::ALL {
                let x = tensor(&mut rng, &[m, n], DType::F32, dist);
                let w = tensor(&mut rng, &[m], DType::F32, dist);
                let grid = scale_rows.grid(&c, [m, 1, 1]);
                let mut y = poisoned(&[m, n], DType::F32);
                scale_rows
                    .interpret(&c, grid, &x, &w, &mut y)
                    .expect("interpret");
                let case = Case {
                    kernel: format!("scale_rows BM={bm} BN={bn}"),
                    shape: format!("m={m} n={n}"),
                    dist,
                    seed: rng.seed(),
                };
                assert_close(&case, &y, &scale_rows_ref(&x, &w), tolerance(DType::F32));
            }
        }
    }
}

#[test]
fn row_stats_compiles_and_matches_reference() {
    // One row per block spreads the columns over every warp; four rows keep one a warp.
    for (bm, bn, marker) in [
        (1, 2048, ACROSS_WARPS),
        (1, 4096, ACROSS_WARPS),
        (4, 512, ""),
    ] {
        let c = RowStatsComptime { BM: bm, BN: bn };
        assembles_clean(&row_stats, c, marker);
        let mut rng = Rng::from_env();
        for (m, n) in [(1, 1), (3, 5000), (5, 2048)] {
            for dist in Dist::ALL {
                let x = tensor(&mut rng, &[m, n], DType::F32, dist);
                let grid = row_stats.grid(&c, [m, 1, 1]);
                let mut s = poisoned(&[m], DType::F32);
                let mut mx = poisoned(&[m], DType::F32);
                row_stats
                    .interpret(&c, grid, &x, &mut s, &mut mx)
                    .expect("interpret");
                let (rs, rm) = row_stats_ref(&x);
                let case = Case {
                    kernel: format!("row_stats BM={bm} BN={bn}"),
                    shape: format!("m={m} n={n}"),
                    dist,
                    seed: rng.seed(),
                };
                assert_close(&case, &s, &rs, sum_tolerance(n));
                assert_close(&case, &mx, &rm, 0.0);
            }
        }
    }
}

#[test]
fn half_row_sums_compile_and_match_reference() {
    for dtype in [DType::Bf16, DType::F16] {
        for (bm, bn, marker) in [(1, 2048, ACROSS_WARPS), (4, 512, "")] {
            let c = RowSumsHalfComptime {
                BM: bm,
                BN: bn,
                dtype,
            };
            assembles_clean(&row_sums_half, c, marker);
            let mut rng = Rng::from_env();
            for (m, n) in [(1, 1), (3, bn - 5), (5, bn)] {
                for dist in Dist::ALL {
                    let x = tensor(&mut rng, &[m, n], dtype, dist);
                    let grid = row_sums_half.grid(&c, [m, 1, 1]);
                    let mut out = poisoned(&[m], dtype);
                    row_sums_half
                        .interpret(&c, grid, &x, &mut out)
                        .expect("interpret");
                    let case = Case {
                        kernel: format!("row_sums_half {dtype} BM={bm} BN={bn}"),
                        shape: format!("m={m} n={n}"),
                        dist,
                        seed: rng.seed(),
                    };
                    assert_close(&case, &out, &row_stats_ref(&x).0, tolerance(dtype));
                }
            }
        }
    }
}

#[test]
fn col_sums_compiles_and_matches_reference() {
    for (bm, bn) in [(256, 32), (128, 8)] {
        let c = ColSumsComptime { BM: bm, BN: bn };
        assembles_clean(&col_sums, c, ACROSS_WARPS);
        let mut rng = Rng::from_env();
        for (m, n) in [(1, 1), (1000, 33), (256, 64)] {
            for dist in Dist::ALL {
                let x = tensor(&mut rng, &[m, n], DType::F32, dist);
                let grid = col_sums.grid(&c, [n, 1, 1]);
                let mut out = poisoned(&[n], DType::F32);
                col_sums
                    .interpret(&c, grid, &x, &mut out)
                    .expect("interpret");
                let case = Case {
                    kernel: format!("col_sums BM={bm} BN={bn}"),
                    shape: format!("m={m} n={n}"),
                    dist,
                    seed: rng.seed(),
                };
                assert_close(&case, &out, &col_sums_ref(&x), sum_tolerance(m));
            }
        }
    }
}
