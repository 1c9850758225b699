//! Tiles larger than a thread's registers (`large_tiles_kernels`: whole rows of 16384 to
//! 65536 elements, 64 x 8192 blocks, no loop of the user's): the `strip_mine` pass streams
//! them in chunks. Each kernel runs on the interpreter as written and after the pass
//! against its f64 reference (shapes no multiple of any tile, several input distributions,
//! outputs poisoned); its PTX stays under a few thousand lines and ptxas assembles it in
//! seconds without spills, for sm_80 and sm_90a. A tile the pass cannot stream and no
//! thread can hold is an error at the user's line.

mod large_tiles_kernels;

use std::time::{Duration, Instant};

use kiln_ir::dsl::{KernelDef, Spec};
use kiln_ir::interp::{HostArg, run};
use kiln_ir::passes::run_through;
use kiln_ir::print::print_kernel;
use kiln_ir::{DType, HostTensor, Kernel, Target};
use kiln_tests::check::{Case, assert_close, poisoned, sum_tolerance, tolerance};
use kiln_tests::codegen::MAX_PTX_LINES;
use kiln_tests::inputs::{Dist, Rng, tensor};
use kiln_tests::sweep::sweep;
use large_tiles_kernels::*;

/// The kernel as `strip_mine` leaves it (the passes before it, then it).
fn stripped(k: &Kernel, target: Target) -> Kernel {
    let mut k = k.clone();
    run_through(&mut k, target, "strip_mine").unwrap_or_else(|d| panic!("{d}"));
    k
}

fn build<D: KernelDef>(def: &D, c: D::Comptime) -> Kernel {
    def.build(&Spec::uniform(c, def.signature(), false))
        .unwrap_or_else(|d| panic!("{}: {d}", def.name()))
}

fn try_build<D: KernelDef>(def: &D, c: D::Comptime) -> Result<Kernel, kiln_ir::Diagnostic> {
    def.build(&Spec::uniform(c, def.signature(), false))
}

/// How many `for` loops the IR prints.
fn loops(k: &Kernel) -> usize {
    print_kernel(k).matches(" for ").count()
}

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

/// Compiles for sm_80 and sm_90a, aligned and not: fewer than [`MAX_PTX_LINES`] lines, no
/// spills, ptxas done in seconds. Returns the largest line count.
fn compact<D: KernelDef>(def: &D, c: D::Comptime) -> usize
where
    D::Comptime: Copy,
{
    let mut most = 0;
    for aligned in [false, true] {
        let k = def
            .build(&Spec::uniform(c, def.signature(), aligned))
            .unwrap_or_else(|d| panic!("{}: {d}", def.name()));
        for target in [Target::Sm80, Target::Sm90a] {
            let what = format!("{} on {target}, aligned {aligned}", k.name);
            let m = kiln_ptx::compile(&k, target).unwrap_or_else(|e| panic!("{what}: {e}"));
            let lines = m.ptx.lines().count();
            assert!(lines < MAX_PTX_LINES, "{what}: {lines} lines of PTX");
            most = most.max(lines);
            let start = Instant::now();
            let report =
                kiln_ptx::ptxas::check(&m.ptx, target).unwrap_or_else(|e| panic!("{what}: {e}"));
            let took = start.elapsed();
            assert!(!report.spills(), "{what} spills: {report}");
            println!("{what}: {lines} PTX lines, ptxas {took:.1?}: {report}");
            // Generous for a shared, loaded machine; unrolled, these took minutes.
            assert!(
                took < Duration::from_secs(20),
                "{what}: ptxas took {took:?}"
            );
        }
    }
    most
}

/// `y` (f32, of `shape`, poisoned first) after `kernel` runs on the interpreter over `x` on
/// `grid`.
fn run_xy(kernel: &Kernel, grid: [u32; 3], x: &HostTensor, shape: &[usize]) -> HostTensor {
    let mut y = poisoned(shape, DType::F32);
    run(
        kernel,
        grid,
        &mut [HostArg::Tensor(x), HostArg::TensorMut(&mut y)],
    )
    .expect("interpret");
    y
}

/// A shape `(m, n)` as the failure messages write it.
fn m_n((m, n): (usize, usize)) -> String {
    format!("m={m} n={n}")
}

#[test]
fn whole_row_softmax_streams_in_three_loops_and_matches_reference() {
    let mut rng = Rng::from_env();
    for (bm, bn) in [(1, 16384), (2, 32768), (1, 65536)] {
        let c = WholeRowSoftmaxComptime { BM: bm, BN: bn };
        let k = build(&whole_row_softmax, c);
        let s = stripped(&k, Target::Sm80);
        // max, sum, then the normalised store (which recomputes the exponentials).
        assert_eq!(loops(&k), 0);
        assert_eq!(loops(&s), 3, "{}", print_kernel(&s));
        let shapes = [(1, 1), (3, bn / 2 + 77), (bm + 1, bn)];
        let kernel = format!("whole_row_softmax BM={bm} BN={bn}");
        sweep(
            &mut rng,
            &kernel,
            shapes,
            &Dist::ALL,
            m_n,
            |rng, (m, n), case| {
                let x = tensor(rng, &[m, n], DType::F32, case.dist);
                let grid = whole_row_softmax.grid(&c, [m, 1, 1]);
                let want = softmax_ref(&x);
                for (what, kernel) in [("as written", &k), ("strip-mined", &s)] {
                    let y = run_xy(kernel, grid, &x, &[m, n]);
                    let case = Case {
                        kernel: format!("{} {what}", case.kernel),
                        ..case.clone()
                    };
                    assert_close(&case, &y, &want, sum_tolerance(n));
                }
            },
        );
    }
}

#[test]
fn whole_row_layer_norm_matches_reference_before_and_after_the_pass() {
    let mut rng = Rng::from_env();
    let c = WholeRowLayerNormComptime::default();
    let k = build(&whole_row_layer_norm, c);
    let s = stripped(&k, Target::Sm80);
    // The maximum, the mean, the variance, then the normalised store.
    assert_eq!(loops(&s), 4, "{}", print_kernel(&s));
    let eps = 1e-5;
    let shapes = [(1, 1), (3, 20000), (5, 32768)];
    sweep(
        &mut rng,
        "whole_row_layer_norm",
        shapes,
        &Dist::ALL,
        m_n,
        |rng, (m, n), case| {
            let x = tensor(rng, &[m, n], DType::F32, case.dist);
            let w = tensor(rng, &[n], DType::F32, Dist::Normal);
            let b = tensor(rng, &[n], DType::F32, Dist::Normal);
            let (yr, mr, rr) = layer_norm_ref(&x, &w, &b, eps);
            let grid = whole_row_layer_norm.grid(&c, [m, 1, 1]);
            for (what, kernel) in [("as written", &k), ("strip-mined", &s)] {
                let mut y = poisoned(&[m, n], DType::F32);
                let mut mu = poisoned(&[m], DType::F32);
                let mut rs = poisoned(&[m], DType::F32);
                run(
                    kernel,
                    grid,
                    &mut [
                        HostArg::Tensor(&x),
                        HostArg::Tensor(&w),
                        HostArg::Tensor(&b),
                        HostArg::TensorMut(&mut y),
                        HostArg::TensorMut(&mut mu),
                        HostArg::TensorMut(&mut rs),
                        HostArg::F32(eps as f32),
                    ],
                )
                .expect("interpret");
                let case = Case {
                    kernel: format!("{} {what}", case.kernel),
                    ..case.clone()
                };
                // The mean sums the offsets from the row's maximum, some four standard
                // deviations each for normal rows: its f32 rounding, relative to the spread
                // that the output is scaled by, is about four sums' worth.
                let tol = sum_tolerance(4 * n);
                assert_close(&case, &y, &yr, tol);
                assert_close(&case, &mu, &mr, tol);
                assert_close(&case, &rs, &rr, tol);
            }
        },
    );
}

#[test]
fn half_precision_row_sums_accumulate_in_f32_across_chunks() {
    let mut rng = Rng::from_env();
    for dtype in [DType::F32, DType::Bf16, DType::F16] {
        let c = WholeRowSumsComptime {
            dtype,
            ..WholeRowSumsComptime::default()
        };
        let k = build(&whole_row_sums, c);
        let s = stripped(&k, Target::Sm80);
        assert_eq!(loops(&s), 1, "{}", print_kernel(&s));
        // An f16 sum of 65536 large or equal values overflows f16 (65504) in the reference
        // too: f16 rows stay where the sum fits.
        let (ns, dists) = match dtype {
            DType::F16 => ([1, 1000, 20000], &[Dist::Uniform, Dist::Normal][..]),
            _ => ([1, 1000, 65536], &Dist::ALL[..]),
        };
        let kernel = format!("whole_row_sums {dtype}");
        sweep(
            &mut rng,
            &kernel,
            ns,
            dists,
            |n: usize| format!("n={n}"),
            |rng, n, case| {
                let x = tensor(rng, &[2, n], dtype, case.dist);
                let grid = whole_row_sums.grid(&c, [2, 1, 1]);
                for (what, kernel) in [("as written", &k), ("strip-mined", &s)] {
                    let mut y = poisoned(&[2], dtype);
                    run(
                        kernel,
                        grid,
                        &mut [HostArg::Tensor(&x), HostArg::TensorMut(&mut y)],
                    )
                    .expect("interpret");
                    let case = Case {
                        kernel: format!("{} {what}", case.kernel),
                        ..case.clone()
                    };
                    // One rounding to the dtype at the end, f32 sums before it.
                    assert_close(
                        &case,
                        &y,
                        &row_sums_ref(&x),
                        sum_tolerance(n).max(tolerance(dtype)),
                    );
                }
            },
        );
    }
}

#[test]
fn double_centering_reduces_both_dimensions_of_one_large_tile() {
    let mut rng = Rng::from_env();
    let c = DoubleCenterComptime::default();
    let k = build(&double_center, c);
    let s = stripped(&k, Target::Sm80);
    assert_eq!(loops(&s), 2, "{}", print_kernel(&s));
    let shapes = [(1, 1), (50, 5000), (64, 8192), (7, 8000)];
    sweep(
        &mut rng,
        "double_center",
        shapes,
        &Dist::ALL,
        m_n,
        |rng, (m, n), case| {
            let x = tensor(rng, &[m, n], DType::F32, case.dist);
            let want = double_center_ref(&x);
            for (what, kernel) in [("as written", &k), ("strip-mined", &s)] {
                let y = run_xy(kernel, [1, 1, 1], &x, &[m, n]);
                let case = Case {
                    kernel: format!("{} {what}", case.kernel),
                    ..case.clone()
                };
                assert_centered(&case, &y, &want, &x, sum_tolerance(n.max(m)));
            }
        },
    );
}

/// Dropout's Philox stream is a function of the element index, so the chunks must draw
/// exactly what the whole tile draws.
#[test]
fn dropout_on_a_huge_tile_is_bit_identical_after_the_pass() {
    let mut rng = Rng::from_env();
    let c = BigDropoutComptime::default();
    let k = build(&big_dropout, c);
    let s = stripped(&k, Target::Sm80);
    assert_eq!(loops(&s), 1, "{}", print_kernel(&s));
    for n in [1, 70000, 131072] {
        let x = tensor(&mut rng, &[n], DType::F32, Dist::Normal);
        let seed = rng.next_u64() as u32;
        let p = 0.3f32;
        let grid = big_dropout.grid(&c, [n, 1, 1]);
        let mut outs = Vec::new();
        for kernel in [&k, &s] {
            let mut y = poisoned(&[n], DType::F32);
            run(
                kernel,
                grid,
                &mut [
                    HostArg::Tensor(&x),
                    HostArg::TensorMut(&mut y),
                    HostArg::F32(p),
                    HostArg::U32(seed),
                ],
            )
            .expect("interpret");
            outs.push(y.to_f64_vec());
        }
        assert_eq!(outs[0], outs[1], "n={n} KILN_SEED={}", rng.seed());
        let xv = x.to_f64_vec();
        let kept = outs[1].iter().filter(|&&v| v != 0.0).count();
        for (i, &v) in outs[1].iter().enumerate() {
            let scaled = f64::from(xv[i] as f32 * (1.0 / (1.0 - p)));
            assert!(v == 0.0 || v == scaled, "element {i}: {v} vs {scaled}");
        }
        if n > 10000 {
            let frac = kept as f64 / n as f64;
            assert!((frac - 0.7).abs() < 0.02, "kept {frac} of {n}");
        }
    }
}

#[test]
fn large_tile_kernels_compile_to_compact_ptx_without_spills() {
    let softmax = compact(
        &whole_row_softmax,
        WholeRowSoftmaxComptime { BM: 1, BN: 65536 },
    );
    compact(
        &whole_row_softmax,
        WholeRowSoftmaxComptime { BM: 2, BN: 32768 },
    );
    compact(&whole_row_layer_norm, WholeRowLayerNormComptime::default());
    compact(
        &whole_row_sums,
        WholeRowSumsComptime {
            dtype: DType::Bf16,
            ..WholeRowSumsComptime::default()
        },
    );
    compact(&big_dropout, BigDropoutComptime::default());
    compact(&big_randn_sin, BigRandnSinComptime::default());
    compact(&double_center, DoubleCenterComptime::default());
    // Three loops of a few vectors a thread each: far from the bound.
    assert!(softmax < 2000, "{softmax} lines");
}

#[test]
fn a_large_tile_carried_around_a_loop_is_an_error_at_its_line() {
    let line = include_str!("large_tiles_kernels/mod.rs")
        .lines()
        .position(|l| l.contains("MARK-carried") && l.contains("let mut acc"))
        .expect("marker") as u32
        + 1;
    let k = build(&carried_rescaled_row, CarriedRescaledRowComptime::default());
    for target in [Target::Sm80, Target::Sm90a] {
        let d = kiln_ptx::compile(&k, target).expect_err("too large");
        let text = d.to_string();
        assert!(text.contains("large_tiles_kernels/mod.rs"), "{text}");
        assert!(text.contains(&format!(":{line}:")), "{text}");
        assert!(
            text.contains("1x65536 f32 tile takes 262144 bytes"),
            "{text}"
        );
        assert!(
            text.contains("kiln streams a large tile in chunks, but not this one")
                && text.contains("a reduction along its long dimension inside the loop"),
            "{text}"
        );
    }
    // A smaller row fits a thread's registers and compiles as before.
    let small = build(
        &carried_rescaled_row,
        CarriedRescaledRowComptime { BN: 4096 },
    );
    kiln_ptx::compile(&small, Target::Sm80).expect("fits");
}

/// A whole row read only inside a branch of the user's loop keeps its whole tile: an error at
/// its line saying why (the pass chunked the row and left the branch reading it, an internal
/// error the fuzzer found).
#[test]
fn a_large_tile_read_inside_a_branch_of_a_users_loop_is_an_error_at_its_line() {
    let line = include_str!("large_tiles_kernels/mod.rs")
        .lines()
        .position(|l| l.contains("MARK-branch"))
        .expect("marker") as u32
        + 1;
    let k = build(
        &row_stored_in_a_branch,
        RowStoredInABranchComptime::default(),
    );
    for target in [Target::Sm80, Target::Sm90a] {
        let text = kiln_ptx::compile(&k, target)
            .expect_err("too large")
            .to_string();
        assert!(text.contains(&format!("mod.rs:{line}:")), "{text}");
        assert!(
            text.contains("a tile read inside a nested loop or branch")
                && !text.contains("internal"),
            "{text}"
        );
    }
    let small = build(
        &row_stored_in_a_branch,
        RowStoredInABranchComptime { BN: 2048 },
    );
    kiln_ptx::compile(&small, Target::Sm80).expect("fits");
}

/// A tile carried around the user's loop streams with it: the user's loop runs once per
/// chunk, inside the chunk loop, its loads (and stores) moved to the chunk; as written and
/// after the pass against f64 on the interpreter (odd shapes, every distribution), compact
/// PTX without spills.
#[test]
fn a_tile_carried_around_a_users_loop_streams_with_it() {
    let mut rng = Rng::from_env();
    let c = CarriedRowComptime::default();
    let k = build(&carried_row, c);
    let s = stripped(&k, Target::Sm80);
    let ir = print_kernel(&s);
    assert_eq!(loops(&s), 2, "{ir}");
    assert!(!ir.contains("1x65536>"), "{ir}");
    for (m, n) in [(1, 1), (3, 40000), (2, 65536)] {
        for dist in Dist::ALL {
            let x = tensor(&mut rng, &[m, n], DType::F32, dist);
            let want = carried_row_ref(&x);
            for (what, kernel) in [("as written", &k), ("strip-mined", &s)] {
                let y = run_xy(kernel, [1, 1, 1], &x, &[1, n]);
                let case = Case {
                    kernel: format!("carried_row {what}"),
                    shape: m_n((m, n)),
                    dist,
                    seed: rng.seed(),
                };
                assert_close(&case, &y, &want, sum_tolerance(m));
            }
        }
    }
    compact(&carried_row, c);

    let c = RunningBlocksComptime::default();
    let k = build(&running_blocks, c);
    let s = stripped(&k, Target::Sm80);
    let ir = print_kernel(&s);
    assert_eq!(loops(&s), 2, "{ir}");
    assert!(!ir.contains("64x1024>"), "{ir}");
    for (m, n) in [(1, 1), (100, 1500), (64, 1024)] {
        for dist in [Dist::Uniform, Dist::Normal, Dist::Large] {
            let x = tensor(&mut rng, &[m, n], DType::F32, dist);
            let want = running_blocks_ref(&x, c.BM);
            let grid = running_blocks.grid(&c, [n, 1, 1]);
            for (what, kernel) in [("as written", &k), ("strip-mined", &s)] {
                let y = run_xy(kernel, grid, &x, &[m, n]);
                let case = Case {
                    kernel: format!("running_blocks {what}"),
                    shape: m_n((m, n)),
                    dist,
                    seed: rng.seed(),
                };
                assert_close(&case, &y, &want, sum_tolerance(m.div_ceil(c.BM)));
            }
        }
    }
    compact(&running_blocks, c);
}

/// A large tile read in the body of a loop that does not carry it: the loop runs once per
/// chunk (it was left reading the tile the pass had chunked away: an internal error the
/// fuzzer found).
#[test]
fn a_large_tile_read_inside_a_users_loop_streams_with_it() {
    let mut rng = Rng::from_env();
    let c = ScaledRowsComptime::default();
    let k = build(&scaled_rows, c);
    let s = stripped(&k, Target::Sm80);
    let ir = print_kernel(&s);
    assert_eq!(loops(&s), 2, "{ir}");
    assert!(!ir.contains("1x65536>"), "{ir}");
    for (x_rows, m, n) in [(1, 1, 1), (2, 3, 40000), (1, 5, 65536)] {
        for dist in Dist::ALL {
            let x = tensor(&mut rng, &[x_rows, n], DType::F32, dist);
            let want = scaled_rows_ref(&x, m);
            for (what, kernel) in [("as written", &k), ("strip-mined", &s)] {
                let y = run_xy(kernel, [1, 1, 1], &x, &[m, n]);
                let case = Case {
                    kernel: format!("scaled_rows {what}"),
                    shape: m_n((m, n)),
                    dist,
                    seed: rng.seed(),
                };
                assert_close(&case, &y, &want, tolerance(DType::F32));
            }
        }
    }
    compact(&scaled_rows, c);
}

/// Two whole-row stores into rows of one tensor that may be the same row, with one-element
/// stores into them between and after: each row store gets its own chunk loop and every
/// store keeps its order (a later store wins where they overlap), as written and after the
/// pass on the interpreter, exactly. (The pass kept the whole row, for want of an order
/// between the stores, in a kernel the fuzzer built: 23781 lines of PTX.)
#[test]
fn stores_to_one_tensor_keep_their_order_when_streamed() {
    let mut rng = Rng::from_env();
    let c = OverlappingRowsComptime::default();
    let k = build(&overlapping_rows, c);
    let s = stripped(&k, Target::Sm80);
    let ir = print_kernel(&s);
    assert_eq!(loops(&s), 2, "{ir}");
    assert!(!ir.contains("1x65536>"), "{ir}");
    for (m, n) in [(1, 1), (1, 40000), (2, 3), (2, 65536)] {
        for dist in Dist::ALL {
            let x = tensor(&mut rng, &[1, n], DType::F32, dist);
            let want = overlapping_rows_ref(&x, m);
            for (what, kernel) in [("as written", &k), ("strip-mined", &s)] {
                let y = run_xy(kernel, [1, 1, 1], &x, &[m, n]);
                let case = Case {
                    kernel: format!("overlapping_rows {what}"),
                    shape: m_n((m, n)),
                    dist,
                    seed: rng.seed(),
                };
                assert_eq!(y.to_f64_vec(), want, "{case}");
            }
        }
    }
    compact(&overlapping_rows, c);
}

#[test]
fn kiln_ir_after_strip_mine_shows_the_chunk_loops() {
    let ir = |after: &str| {
        kiln::cli::run_args([
            "kiln",
            "ir",
            "whole_row_softmax",
            "--after",
            after,
            "-D",
            "BN=65536",
        ])
        .unwrap_or_else(|e| panic!("{e}"))
    };
    let before = ir("canonicalize");
    assert!(before.contains("rt<f32,1x65536>"), "{before}");
    assert!(!before.contains(" for "), "{before}");
    let after = ir("strip_mine");
    assert_eq!(after.matches(" for ").count(), 3, "{after}");
    assert!(!after.contains("rt<f32,1x65536>"), "{after}");
    // The chunks keep the user's lines.
    assert!(after.contains("large_tiles_kernels/mod.rs:"), "{after}");
}

/// An in-place elementwise update streams (each chunk touches only its own elements); an
/// in-place update that needs a reduction of the row first would re-read the row after
/// writing part of it, so it keeps its whole tile, which no thread holds: an error at the
/// load's line saying why.
#[test]
fn in_place_updates_stream_only_where_chunks_cannot_see_each_others_writes() {
    let mut rng = Rng::from_env();
    let c = AffineInPlaceComptime::default();
    let k = build(&affine_in_place, c);
    let s = stripped(&k, Target::Sm80);
    assert_eq!(loops(&s), 1, "{}", print_kernel(&s));
    for (m, n) in [(1, 1), (3, 50000), (2, 65536)] {
        let x = tensor(&mut rng, &[m, n], DType::F32, Dist::Normal);
        let want: Vec<f64> = x
            .to_f64_vec()
            .iter()
            .map(|&v| f64::from(v as f32 * 2.0 + 1.0))
            .collect();
        let mut y = x.clone();
        run(&s, [m as u32, 1, 1], &mut [HostArg::TensorMut(&mut y)]).expect("interpret");
        assert_eq!(y.to_f64_vec(), want, "m={m} n={n} KILN_SEED={}", rng.seed());
    }
    compact(&affine_in_place, c);

    let line = include_str!("large_tiles_kernels/mod.rs")
        .lines()
        .position(|l| l.contains("MARK-in-place"))
        .expect("marker") as u32
        + 1;
    let k = build(&normalise_in_place, NormaliseInPlaceComptime::default());
    let d = kiln_ptx::compile(&k, Target::Sm80).expect_err("too large");
    let text = d.to_string();
    assert!(
        text.contains(&format!("large_tiles_kernels/mod.rs:{line}:")),
        "{text}"
    );
    assert!(
        text.contains("re-read a tensor the kernel writes"),
        "{text}"
    );
    // The same kernel on a row a thread can hold compiles whole.
    let small = build(&normalise_in_place, NormaliseInPlaceComptime { BN: 4096 });
    kiln_ptx::compile(&small, Target::Sm80).expect("fits");
}

#[test]
fn whole_row_tiles_inside_a_loop_of_the_users_stream_inside_it() {
    let mut rng = Rng::from_env();
    let c = SoftmaxRowsLoopComptime::default();
    let k = build(&softmax_rows_loop, c);
    let s = stripped(&k, Target::Sm80);
    // The user's loop, and the three chunk loops in its body.
    assert_eq!(loops(&k), 1);
    assert_eq!(loops(&s), 4, "{}", print_kernel(&s));
    let shapes = [(1, 1), (3, 20001), (2, 32768)];
    sweep(
        &mut rng,
        "softmax_rows_loop",
        shapes,
        &Dist::ALL,
        m_n,
        |rng, (m, n), case| {
            let x = tensor(rng, &[m, n], DType::F32, case.dist);
            let want = softmax_ref(&x);
            for (what, kernel) in [("as written", &k), ("strip-mined", &s)] {
                let y = run_xy(kernel, [1, 1, 1], &x, &[m, n]);
                let case = Case {
                    kernel: format!("{} {what}", case.kernel),
                    ..case.clone()
                };
                assert_close(&case, &y, &want, sum_tolerance(n));
            }
        },
    );
    compact(&softmax_rows_loop, c);
}

#[test]
fn a_users_loop_carries_what_a_chunk_loop_reduces() {
    let mut rng = Rng::from_env();
    let c = TotalByRowsComptime::default();
    let k = build(&total_by_rows, c);
    let s = stripped(&k, Target::Sm80);
    assert_eq!(loops(&s), 2, "{}", print_kernel(&s));
    let shapes = [(1, 1), (3, 40000), (2, 65536)];
    sweep(
        &mut rng,
        "total_by_rows",
        shapes,
        &Dist::ALL,
        m_n,
        |rng, (m, n), case| {
            let x = tensor(rng, &[m, n], DType::F32, case.dist);
            let want = vec![x.to_f64_vec().iter().sum::<f64>()];
            for (what, kernel) in [("as written", &k), ("strip-mined", &s)] {
                let y = run_xy(kernel, [1, 1, 1], &x, &[1]);
                let case = Case {
                    kernel: format!("{} {what}", case.kernel),
                    ..case.clone()
                };
                assert_close(&case, &y, &want, sum_tolerance(m * n));
            }
        },
    );
    compact(&total_by_rows, c);
}

#[test]
fn extents_reach_a_million_and_a_tile_at_most_sixteen_million_elements() {
    // 1 x 2^20 builds (and streams); 4096 x 8192 is past the element bound.
    let k = build(
        &whole_row_sums,
        WholeRowSumsComptime {
            BN: 1 << 20,
            ..WholeRowSumsComptime::default()
        },
    );
    assert_eq!(loops(&stripped(&k, Target::Sm90a)), 1);
    let d = try_build(&double_center, DoubleCenterComptime { BM: 4096, BN: 8192 })
        .expect_err("too many elements");
    assert_eq!(
        d.message, "a 4096x8192 tile has 33554432 elements; a tile holds at most 16777216",
        "{d}"
    );
    assert!(d.loc.file.ends_with("large_tiles_kernels/mod.rs"), "{d}");
}

/// Histogram kernel `k` streams in one loop and counts `x` into `bins` bins exactly, as
/// written and after the pass.
fn histogram_streams(k: &Kernel, grid: [u32; 3], x: &HostTensor, bins: usize, seed: u64) {
    let s = stripped(k, Target::Sm80);
    assert_eq!(loops(&s), 1, "{}", print_kernel(&s));
    let want = histogram_ref(x, bins);
    for (what, kernel) in [("as written", k), ("strip-mined", &s)] {
        let mut h = HostTensor::full(&[bins], DType::I32, 0.0);
        run(
            kernel,
            grid,
            &mut [HostArg::Tensor(x), HostArg::TensorMut(&mut h)],
        )
        .expect("interpret");
        let shape = &x.shape;
        assert_eq!(
            h.to_f64_vec(),
            want,
            "{what}: {} {shape:?} KILN_SEED={seed}",
            k.name
        );
    }
}

/// Gathers and scatters through index tiles stream like loads and stores: the chunks of a
/// row permutation share the row indices, a histogram's chunks take their own bins.
#[test]
fn gathers_scatters_and_atomics_through_index_tiles_stream() {
    let mut rng = Rng::from_env();
    let c = BigRowPermuteComptime::default();
    let k = build(&big_row_permute, c);
    let s = stripped(&k, Target::Sm80);
    assert_eq!(loops(&s), 1, "{}", print_kernel(&s));
    for (m, n, rows) in [(1, 1, 1), (9, 16383, 7), (6, 5000, 9)] {
        for dist in Dist::ALL {
            let x = tensor(&mut rng, &[m, n], DType::F32, dist);
            // Each destination once (a permutation of the rows, some past the tensor); the
            // sources any row, some past the tensor too.
            let mut dst: Vec<i32> = (0..rows as i32).collect();
            for i in (1..dst.len()).rev() {
                dst.swap(i, rng.range(0, i + 1));
            }
            let src: Vec<i32> = (0..rows).map(|_| rng.range(0, m + 2) as i32).collect();
            let grid = big_row_permute.grid(&c, [rows, 1, 1]);
            let index = |v: &[i32]| HostTensor::from_fn(&[rows], DType::I32, |i| f64::from(v[i]));
            let (src_t, dst_t) = (index(&src), index(&dst));
            let y0 = poisoned(&[rows.saturating_sub(2).max(1), n], DType::F32);
            let want = row_permute_ref(&x, &src, &dst, &y0);
            for (what, kernel) in [("as written", &k), ("strip-mined", &s)] {
                let mut y = y0.clone();
                run(
                    kernel,
                    grid,
                    &mut [
                        HostArg::Tensor(&x),
                        HostArg::Tensor(&src_t),
                        HostArg::Tensor(&dst_t),
                        HostArg::TensorMut(&mut y),
                    ],
                )
                .expect("interpret");
                let got = y.to_f64_vec();
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()));
                assert!(
                    same,
                    "{what}: m={m} n={n} rows={rows} {dist:?} KILN_SEED={}",
                    rng.seed()
                );
            }
        }
    }
    compact(&big_row_permute, c);

    let c = BigHistogramComptime::default();
    let k = build(&big_histogram, c);
    for n in [1, 70000, 131072] {
        for dist in [Dist::Uniform, Dist::Normal, Dist::Large] {
            let x = tensor(&mut rng, &[n], DType::F32, dist);
            let grid = big_histogram.grid(&c, [n, 1, 1]);
            histogram_streams(&k, grid, &x, 37, rng.seed());
        }
    }
    compact(&big_histogram, c);

    // A 2-D index tile into a 1-D histogram (the pass indexed past the coordinates).
    let c = BigHistogram2dComptime::default();
    let k = build(&big_histogram_2d, c);
    for (m, n) in [(1, 1), (5000, 17), (4096, 40)] {
        let x = tensor(&mut rng, &[m, n], DType::F32, Dist::Uniform);
        let grid = big_histogram_2d.grid(&c, [m, n, 1]);
        histogram_streams(&k, grid, &x, 19, rng.seed());
    }
    compact(&big_histogram_2d, c);
}

/// A tile the pass keeps whole (carried around the user's loop) whose `cos` sequences would
/// take thousands of lines inline: each element calls the function, written once, so the
/// PTX stays compact; against f64 on the interpreter.
#[test]
fn long_math_on_a_whole_tile_calls_functions_written_once() {
    let mut rng = Rng::from_env();
    let c = CarriedCosLogComptime::default();
    let k = build(&carried_cos_log, c);
    assert_eq!(
        loops(&stripped(&k, Target::Sm80)),
        1,
        "only the user's loop"
    );
    for target in [Target::Sm80, Target::Sm90a] {
        let ptx = kiln_ptx::compile(&k, target)
            .unwrap_or_else(|e| panic!("{target}: {e}"))
            .ptx;
        // `cos` (80 lines a call) is called; `log` (under 32) stays inline at 64 elements.
        let f = "kiln_cos_f32";
        assert_eq!(
            ptx.matches(&format!(".func (.reg .f32 %ret) {f}(")).count(),
            1,
            "{target}: {f} defined once"
        );
        // One call an element a thread: 16384 columns over 256 threads.
        assert_eq!(ptx.matches(&format!("), {f}, (")).count(), 64, "{target}");
        assert!(!ptx.contains("kiln_log_f32"), "{target}: log inline");
    }
    compact(&carried_cos_log, c);
    for (m, n) in [(1, 1), (3, 20001), (5, 16384)] {
        for dist in [Dist::Uniform, Dist::Normal, Dist::Large] {
            let x = tensor(&mut rng, &[m, n], DType::F32, dist);
            let y = run_xy(&k, carried_cos_log.grid(&c, [n, 1, 1]), &x, &[1, n]);
            let case = Case {
                kernel: "carried_cos_log".into(),
                shape: m_n((m, n)),
                dist,
                seed: rng.seed(),
            };
            assert_close(&case, &y, &cos_log_ref(&x), sum_tolerance(m));
        }
    }
}
