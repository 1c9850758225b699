//! The kernel library's losses and backward passes (`kiln_examples::cross_entropy`,
//! `softmax::softmax_backward`, `norm_backward`) on the interpreter against f64 references,
//! every input distribution, shapes that are no multiple of the tiles, poisoned outputs; and
//! each compiled for sm_80 and sm_90a into compact PTX that ptxas assembles without spills.

mod library;

use kiln_examples::cross_entropy::{
    CrossEntropyBackwardComptime, CrossEntropyComptime, CrossEntropyReduceComptime, cross_entropy,
    cross_entropy_backward, cross_entropy_reduce,
};
use kiln_examples::histogram::{HistogramComptime, histogram};
use kiln_examples::moe::{
    MoeCountComptime, MoeExpertsComptime, MoeScatterComptime, moe_count, moe_experts, moe_scatter,
};
use kiln_examples::norm_backward::{
    LayerNormBackwardComptime, RmsNormBackwardComptime, SumPartialsComptime, layer_norm_backward,
    rms_norm_backward, sum_partials,
};
use kiln_examples::rotary::{RotaryComptime, rotary};
use kiln_examples::rows::{norm_backward_config, row_config};
use kiln_examples::softmax::{SoftmaxBackwardComptime, softmax_backward};
use kiln_ir::dsl::KernelDef;
use kiln_ir::{DType, HostTensor};
use kiln_tests::check::{
    Case, assert_close, assert_close_to_terms, bits, lse_terms, poisoned, tolerance,
};
use kiln_tests::codegen::assembles_clean;
use kiln_tests::inputs::{Dist, Rng, tensor};
use kiln_tests::reference;
use library::{
    CROSS_ENTROPY_CONFIGS, ROTARY_SHAPES, SHAPES, assert_one_column_rms_dx, assert_same_routes,
    f32_tensor, moe_choices, moe_grouped, moe_reference, moe_routes, norm_inputs, rotary_tables,
    targets,
};

fn case(kernel: String, m: usize, n: usize, dist: Dist, rng: &Rng) -> Case {
    Case {
        kernel,
        shape: format!("m={m} n={n}"),
        dist,
        seed: rng.seed(),
    }
}

/// Both target widths (int32, an int64's words), a nonnegative `ignore_index` (class 1) and
/// PyTorch's -100, and every reduction of the backward.
#[test]
fn cross_entropy_forward_and_backward() {
    let mut rng = Rng::from_env();
    for dtype in [DType::Bf16, DType::F32] {
        for (bm, bn, nw, stages) in CROSS_ENTROPY_CONFIGS {
            let c = CrossEntropyComptime {
                BM: bm,
                BN: bn,
                NW: nw,
                STAGES: stages,
                dtype,
            };
            // The backward for each reduction: none, a sum, a mean.
            let backward = |(reduced, mean)| CrossEntropyBackwardComptime {
                REDUCED: reduced,
                MEAN: mean,
                BM: bm,
                BN: bn,
                NW: nw,
                STAGES: stages,
                dtype,
            };
            let reductions = [(false, false), (true, false), (true, true)];
            assembles_clean(&cross_entropy, c, "");
            for r in reductions {
                assembles_clean(&cross_entropy_backward, backward(r), "");
            }
            for (m, v) in SHAPES {
                for (i, dist) in Dist::ALL.into_iter().enumerate() {
                    let (words, ignore) = [(1, -100), (2, 1)][i % 2];
                    let x = tensor(&mut rng, &[m, v], dtype, dist);
                    let t = targets(&mut rng, m, v, words);
                    let k = format!(
                        "cross_entropy {dtype} BM={bm} BN={bn} NW={nw} STAGES={stages} words={words}"
                    );
                    let cs = case(k, m, v, dist, &rng);
                    let (loss, lse) = cross_entropy_run(&c, &x, &t, ignore);
                    let (rl, rlse) = reference::cross_entropy(&x, &t, ignore);
                    assert_close(&cs, &loss, &rl, tolerance(DType::F32) * 10.0);
                    let terms = lse_terms(&rlse);
                    assert_close_to_terms(&cs, &lse, &rlse, &terms, tolerance(DType::F32));
                    let stats = cross_entropy_stats(&cs, &loss, &t, ignore, i % 2 == 1);
                    let counted = (0..m)
                        .filter(|&r| reference::cross_entropy_class(&t, r, ignore).is_some())
                        .count() as f64;
                    let dl = tensor(&mut rng, &[m], DType::F32, Dist::Normal);
                    for (reduced, mean) in reductions {
                        let cb = backward((reduced, mean));
                        let g: Vec<f64> = (0..m)
                            .map(|r| match (reduced, mean) {
                                (false, _) => dl.data.get_f64(r),
                                (true, false) => dl.data.get_f64(0),
                                (true, true) => dl.data.get_f64(0) / counted,
                            })
                            .collect();
                        let mut dx = poisoned(&[m, v], dtype);
                        let grid = cross_entropy_backward.grid(&cb, [m, 1, 1]);
                        cross_entropy_backward
                            .interpret(&cb, grid, &x, &t, &lse, &dl, &stats, &mut dx, ignore)
                            .expect("interpret");
                        let k = format!(
                            "cross_entropy_backward {dtype} BM={bm} BN={bn} NW={nw} STAGES={stages} \
                             words={words} reduced={reduced} mean={mean}"
                        );
                        let rdx = reference::cross_entropy_backward(&x, &t, ignore, &g);
                        assert_close(&case(k, m, v, dist, &rng), &dx, &rdx, tolerance(dtype));
                    }
                }
            }
        }
    }
}

/// [`cross_entropy`] on the interpreter, its outputs poisoned first: `(loss, lse)`.
fn cross_entropy_run(
    c: &CrossEntropyComptime,
    x: &HostTensor,
    t: &HostTensor,
    ignore: i32,
) -> (HostTensor, HostTensor) {
    let m = x.shape[0];
    let (mut loss, mut lse) = (poisoned(&[m], DType::F32), poisoned(&[m], DType::F32));
    cross_entropy
        .interpret(
            c,
            cross_entropy.grid(c, [m, 1, 1]),
            x,
            t,
            &mut loss,
            &mut lse,
            ignore,
        )
        .expect("interpret");
    (loss, lse)
}

/// [`cross_entropy_reduce`] of `loss` (a sum, or the `mean`) against the f64 sum and count
/// of the rows that count (a mean over none is NaN, as PyTorch's); its `[reduced, count]`
/// output. Pipelined 2 and 3 deep it must give the same bits: prefetching moves loads, never
/// the order of the sums.
fn cross_entropy_stats(
    cs: &Case,
    loss: &HostTensor,
    t: &HostTensor,
    ignore: i32,
    mean: bool,
) -> HostTensor {
    let m = loss.shape[0];
    let run = |stages| {
        let c = CrossEntropyReduceComptime {
            MEAN: mean,
            BM: 256,
            NW: 4,
            STAGES: stages,
        };
        assembles_clean(&cross_entropy_reduce, c, "");
        let mut out = poisoned(&[2], DType::F32);
        cross_entropy_reduce
            .interpret(&c, [1, 1, 1], loss, t, &mut out, ignore)
            .expect("interpret");
        out
    };
    let out = run(1);
    for stages in [2, 3] {
        assert_eq!(
            bits(&run(stages)),
            bits(&out),
            "{cs}: cross_entropy_reduce mean={mean} STAGES={stages} against STAGES=1"
        );
    }
    let rows = (0..m).filter(|&r| reference::cross_entropy_class(t, r, ignore).is_some());
    let count = rows.count() as f64;
    let total: f64 = loss.to_f64_vec().iter().sum();
    // A sum of signed losses may cancel: its error is measured against the absolute terms'.
    let terms: f64 = loss.to_f64_vec().iter().map(|l| l.abs()).sum();
    let cs = Case {
        kernel: format!("cross_entropy_reduce mean={mean} of {}", cs.kernel),
        ..cs.clone()
    };
    let got = out.to_f64_vec();
    assert_eq!(got[1], count, "{cs}: counted rows");
    if mean && count == 0.0 {
        assert!(
            got[0].is_nan(),
            "{cs}: a mean over no row is NaN, got {}",
            got[0]
        );
    } else {
        let (want, terms) = if mean {
            (total / count, terms / count)
        } else {
            (total, terms)
        };
        assert_close_to_terms(
            &cs,
            &f32_tensor(&[1], &got[..1]),
            &[want],
            &[terms],
            tolerance(DType::F32),
        );
    }
    out
}

/// The reduction over more rows than one step takes, not a multiple of it, int64 targets.
#[test]
fn cross_entropy_reduce_walks_many_rows() {
    let mut rng = Rng::from_env();
    let m = 1000;
    let loss = tensor(&mut rng, &[m], DType::F32, Dist::Uniform);
    let t = targets(&mut rng, m, 50, 2);
    let cs = case("cross_entropy_reduce".into(), m, 50, Dist::Uniform, &rng);
    for mean in [false, true] {
        cross_entropy_stats(&cs, &loss, &t, -100, mean);
    }
}

/// Every row ignored: the sum is 0, the mean NaN (PyTorch's), and no row has a gradient.
#[test]
fn cross_entropy_of_ignored_rows_only() {
    let mut rng = Rng::from_env();
    let (m, v) = (37, 300);
    let x = tensor(&mut rng, &[m, v], DType::F32, Dist::Normal);
    let t = HostTensor::from_fn(
        &[m, 1],
        DType::I32,
        |r| if r % 2 == 0 { -100.0 } else { 5.0 },
    );
    let c = CrossEntropyComptime {
        BM: 4,
        BN: 256,
        NW: 4,
        STAGES: 2,
        dtype: DType::F32,
    };
    let (loss, lse) = cross_entropy_run(&c, &x, &t, 5);
    assert!(loss.to_f64_vec().iter().all(|&l| l == 0.0));
    let cs = case(
        "cross_entropy ignored rows".into(),
        m,
        v,
        Dist::Normal,
        &rng,
    );
    let stats = cross_entropy_stats(&cs, &loss, &t, 5, true);
    let dl = f32_tensor(&[1], &[1.0]);
    let cb = CrossEntropyBackwardComptime {
        REDUCED: true,
        MEAN: true,
        BM: 4,
        BN: 256,
        NW: 4,
        STAGES: 2,
        dtype: DType::F32,
    };
    let mut dx = poisoned(&[m, v], DType::F32);
    cross_entropy_backward
        .interpret(
            &cb,
            cross_entropy_backward.grid(&cb, [m, 1, 1]),
            &x,
            &t,
            &lse,
            &dl,
            &stats,
            &mut dx,
            5,
        )
        .expect("interpret");
    assert!(
        dx.to_f64_vec().iter().all(|&g| g == 0.0),
        "no gradient for ignored rows"
    );
}

#[test]
fn softmax_backward_matches_reference() {
    let mut rng = Rng::from_env();
    for dtype in [DType::F32, DType::Bf16] {
        // A row in one tile (read once) and rows longer than a tile (two loops).
        for (bm, bn, nw) in [(4, 1024, 4), (1, 4096, 4), (1, 8192, 8)] {
            let c = SoftmaxBackwardComptime {
                BM: bm,
                BN: bn,
                NW: nw,
                dtype,
            };
            assembles_clean(&softmax_backward, c, "");
            for (m, n) in SHAPES {
                for dist in Dist::ALL {
                    let y = tensor(&mut rng, &[m, n], dtype, dist);
                    let dy = tensor(&mut rng, &[m, n], dtype, Dist::Normal);
                    let grid = softmax_backward.grid(&c, [m, 1, 1]);
                    let mut dx = poisoned(&[m, n], dtype);
                    softmax_backward
                        .interpret(&c, grid, &y, &dy, &mut dx)
                        .expect("interpret");
                    let k = format!("softmax_backward {dtype} BM={bm} BN={bn} NW={nw}");
                    let r = reference::softmax_backward(&y, &dy);
                    let terms = reference::softmax_backward_terms(&y, &dy);
                    let cs = case(k, m, n, dist, &rng);
                    assert_close_to_terms(&cs, &dx, &r, &terms, tolerance(dtype));
                }
            }
        }
    }
}

/// The backward configurations the row-length choices give at the benchmark's shapes compile
/// compact and without spills on both targets.
#[test]
fn backward_configs_assemble_clean() {
    for (m, n) in [
        (1, 1),
        (4096, 1000),
        (4096, 4097),
        (32768, 8192),
        (65536, 4096),
        (16384, 16384),
    ] {
        for dtype in [DType::F32, DType::Bf16] {
            let r = row_config(n);
            let c = SoftmaxBackwardComptime {
                BM: r.bm,
                BN: r.bn,
                NW: r.nw,
                dtype,
            };
            assembles_clean(&softmax_backward, c, "");
            let b = norm_backward_config(m, n);
            let c = LayerNormBackwardComptime {
                BM: b.bm,
                BN: b.bn,
                RB: b.rb,
                NW: b.nw,
                OCC: b.occ,
                STAGES: 1,
                LC: 0,
                dtype,
            };
            assembles_clean(&layer_norm_backward, c, "");
            let c = RmsNormBackwardComptime {
                BM: b.bm,
                BN: b.bn,
                RB: b.rb,
                NW: b.nw,
                OCC: b.occ,
                STAGES: 1,
                LC: 0,
                dtype,
            };
            assembles_clean(&rms_norm_backward, c, "");
        }
    }
}

/// Two blocks a multiprocessor asked of ptxas (`blocks_per_sm`): RMS norm's backward at 4096
/// columns in bf16 fits them (64 registers of 512 threads) without spills, and its PTX says so.
#[test]
fn a_norm_backward_asks_for_two_blocks_a_multiprocessor() {
    let c = RmsNormBackwardComptime {
        BM: 1,
        BN: 4096,
        RB: 32,
        NW: 16,
        OCC: 2,
        STAGES: 1,
        LC: 0,
        dtype: DType::Bf16,
    };
    assembles_clean(
        &rms_norm_backward,
        c,
        ".maxntid 512, 1, 1\n.minnctapersm 2\n",
    );
}

/// Adds up `part`'s rows with [`sum_partials`] into a `dtype` vector, in steps of 16 rows by
/// 32 columns as written and pipelined 2 deep: the same bits both ways.
fn summed(part: &HostTensor, dtype: DType) -> HostTensor {
    let n = part.shape[1];
    let run = |stages| {
        let c = SumPartialsComptime {
            BM: 16,
            BN: 32,
            STAGES: stages,
            dtype,
        };
        let mut out = poisoned(&[n], dtype);
        sum_partials
            .interpret(&c, sum_partials.grid(&c, [n, 1, 1]), part, &mut out)
            .expect("interpret");
        out
    };
    let out = run(1);
    assert_eq!(
        bits(&run(2)),
        bits(&out),
        "sum_partials STAGES=2 against STAGES=1"
    );
    out
}

#[test]
fn norm_backwards_match_reference() {
    let mut rng = Rng::from_env();
    for dtype in [DType::Bf16, DType::F32] {
        // Rows longer than a tile (all of a block's rows per column tile; with two blocks
        // a multiprocessor, half as many columns a tile; a column tile asked for, `LC`),
        // rows in one tile walked in groups, and a group taller than the block's rows; loops
        // pipelined 2 deep.
        for (bm, bn, rb, nw, occ, stages, lc) in [
            (4, 1024, 16, 8, 1, 1, 0),
            (4, 1024, 16, 8, 2, 1, 0),
            (4, 1024, 16, 8, 1, 1, 64),
            (8, 1024, 4, 8, 1, 1, 0),
            (1, 8192, 4, 16, 1, 1, 0),
            (2, 1024, 8, 8, 1, 2, 0),
        ] {
            let c = LayerNormBackwardComptime {
                BM: bm,
                BN: bn,
                RB: rb,
                NW: nw,
                OCC: occ,
                STAGES: stages,
                LC: lc,
                dtype,
            };
            let cr = RmsNormBackwardComptime {
                BM: bm,
                BN: bn,
                RB: rb,
                NW: nw,
                OCC: occ,
                STAGES: stages,
                LC: lc,
                dtype,
            };
            assembles_clean(&layer_norm_backward, c, "");
            assembles_clean(&rms_norm_backward, cr, "");
            for (bm, bn, stages) in [(64, 128, 1), (128, 32, 2)] {
                let cs = SumPartialsComptime {
                    BM: bm,
                    BN: bn,
                    STAGES: stages,
                    dtype,
                };
                assembles_clean(&sum_partials, cs, "");
            }
            for (m, n) in SHAPES {
                for dist in Dist::ALL {
                    let grid = layer_norm_backward.grid(&c, [m, 1, 1]);
                    let blocks = grid[0] as usize;
                    for rms in [false, true] {
                        let [x, w, mean, rstd, dy] = norm_inputs(&mut rng, m, n, dtype, dist, rms);
                        let mut dx = poisoned(&[m, n], dtype);
                        let mut dw_part = poisoned(&[blocks, n], DType::F32);
                        let mut db_part = poisoned(&[blocks, n], DType::F32);
                        if rms {
                            rms_norm_backward
                                .interpret(&cr, grid, &x, &w, &rstd, &dy, &mut dx, &mut dw_part)
                                .expect("interpret");
                        } else {
                            layer_norm_backward
                                .interpret(
                                    &c,
                                    grid,
                                    &x,
                                    &w,
                                    &mean,
                                    &rstd,
                                    &dy,
                                    &mut dx,
                                    &mut dw_part,
                                    &mut db_part,
                                )
                                .expect("interpret");
                        }
                        let (rdx, rdw, rdb) = reference::norm_backward(
                            &x,
                            &w,
                            &mean.to_f64_vec(),
                            &rstd.to_f64_vec(),
                            &dy,
                            rms,
                        );
                        let name = if rms { "rms_norm" } else { "layer_norm" };
                        let k = format!(
                            "{name}_backward {dtype} BM={bm} BN={bn} RB={rb} NW={nw} OCC={occ} STAGES={stages} LC={lc}"
                        );
                        let cs = case(k, m, n, dist, &rng);
                        if rms && n == 1 {
                            // One column: `dx` is eps-sized, all f32 cancellation; an
                            // absolute bound derived from the magnitudes instead.
                            assert_one_column_rms_dx(&cs, &dx, &rdx, &x, &w, &rstd, &dy);
                        } else {
                            assert_close(&cs, &dx, &rdx, tolerance(dtype) * 4.0);
                        }
                        assert_close(&cs, &summed(&dw_part, dtype), &rdw, tolerance(dtype) * 4.0);
                        if !rms {
                            let db = summed(&db_part, dtype);
                            assert_close(&cs, &db, &rdb, tolerance(dtype) * 4.0);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn rotary_matches_reference() {
    let mut rng = Rng::from_env();
    for dtype in [DType::Bf16, DType::F32] {
        for (d, r, bh, nw) in [(128, 128, 8, 2), (64, 32, 4, 4), (256, 128, 2, 1)] {
            let c = RotaryComptime {
                D: d,
                R: r,
                BH: bh,
                NW: nw,
                dtype,
            };
            assembles_clean(&rotary, c, "");
            for (b, s, h, offset) in ROTARY_SHAPES {
                for dist in Dist::ALL {
                    let x = tensor(&mut rng, &[b, s, h, d], dtype, dist);
                    let (cos, sin) = rotary_tables(s + offset, r, dtype);
                    let grid = rotary.grid(&c, [s, b, h]);
                    let mut y = poisoned(&[b, s, h, d], dtype);
                    rotary
                        .interpret(&c, grid, &x, &cos, &sin, &mut y, offset as i32)
                        .expect("interpret");
                    let k = format!("rotary {dtype} D={d} R={r} BH={bh} NW={nw} offset={offset}");
                    let reference = reference::rotary(&x, &cos, &sin, r, offset);
                    let cs = case(k, b * s, h * d, dist, &rng);
                    assert_close(&cs, &y, &reference, tolerance(dtype));
                }
            }
        }
    }
}

/// `(tokens, experts, top-k, hidden, out)` of the MoE checks: none a multiple of the tiles,
/// one token, every expert chosen, experts left without tokens.
pub const MOE_SHAPES: [(usize, usize, usize, usize, usize); 4] = [
    (1, 1, 1, 1, 1),
    (37, 5, 2, 100, 70),
    (130, 6, 3, 40, 130),
    (5, 3, 3, 33, 65),
];

#[test]
fn moe_experts_match_reference() {
    let mut rng = Rng::from_env();
    for (bm, bn, bk, dtype) in [(64, 64, 32, DType::Bf16), (64, 32, 16, DType::F16)] {
        let c = MoeExpertsComptime {
            BM: bm,
            BN: bn,
            BK: bk,
            dtype,
        };
        assembles_clean(&moe_experts, c, "red.");
        for (t, e, topk, h, n) in MOE_SHAPES {
            for dist in Dist::ALL {
                for split in [1, 3] {
                    let x = tensor(&mut rng, &[t, h], dtype, dist);
                    let w = tensor(&mut rng, &[e, h, n], dtype, dist);
                    let routes = moe_routes(&mut rng, t, e, topk);
                    // `out` accumulates: random contents stand in for poison, since an
                    // element left unwritten keeps them and misses its contributions.
                    let init = tensor(&mut rng, &[t, n], DType::F32, Dist::Normal);
                    let mut out = init.clone();
                    let grid = [e as u32, n.div_ceil(bn) as u32, split];
                    let (offsets, tokens, gates) = &routes;
                    moe_experts
                        .interpret(&c, grid, &x, &w, offsets, tokens, gates, &mut out)
                        .expect("interpret");
                    let want = moe_reference(&x, &w, &routes, &init);
                    let cs = Case {
                        kernel: format!(
                            "moe_experts {dtype} BM={bm} BN={bn} BK={bk} split={split}"
                        ),
                        shape: format!("tokens={t} experts={e} top{topk} h={h} n={n}"),
                        dist,
                        seed: rng.seed(),
                    };
                    assert_close(&cs, &out, &want, tolerance(DType::F32) * 10.0);
                }
            }
        }
    }
}

#[test]
fn histogram_counts_exactly() {
    let mut rng = Rng::from_env();
    for block in [256, 1024] {
        let c = HistogramComptime { BLOCK: block };
        assembles_clean(&histogram, c, "red.");
        for n in [1, 255, 1000, 4097] {
            for bins in [1, 37, 300] {
                let x =
                    HostTensor::from_fn(&[n], DType::I32, |_| rng.range(0, bins + 6) as f64 - 3.0);
                let init = HostTensor::from_fn(&[bins], DType::I32, |_| rng.range(0, 10) as f64);
                let mut h = init.clone();
                histogram
                    .interpret(&c, histogram.grid(&c, [n, 1, 1]), &x, &mut h)
                    .expect("interpret");
                let (xv, mut want) = (x.to_f64_vec(), init.to_f64_vec());
                for v in xv {
                    if (0.0..bins as f64).contains(&v) {
                        want[v as usize] += 1.0;
                    }
                }
                assert_eq!(
                    h.to_f64_vec(),
                    want,
                    "histogram BLOCK={block} n={n} bins={bins} (KILN_SEED={})",
                    rng.seed()
                );
            }
        }
    }
}

/// The router's choices grouped by expert on the device's kernels (`moe_count`, then
/// `moe_scatter`), exactly the host's grouping up to the order within an expert, and fed to
/// `moe_experts`: the layer against f64 from the choices alone.
#[test]
fn moe_routing_groups_the_choices_by_expert() {
    let mut rng = Rng::from_env();
    let cc = MoeCountComptime { BLOCK: 256, BE: 64 };
    let cs = MoeScatterComptime { BLOCK: 256 };
    assembles_clean(&moe_count, cc, "atom.acq_rel.gpu");
    assembles_clean(&moe_scatter, cs, "");
    let ce = MoeExpertsComptime {
        BM: 64,
        BN: 64,
        BK: 32,
        dtype: DType::Bf16,
    };
    for (t, e, topk, h, n) in [(1, 1, 1, 5, 3), (300, 70, 2, 40, 33), (97, 5, 5, 20, 70)] {
        let (experts, weights) = moe_choices(&mut rng, t, e, topk);
        let s = t * topk;
        let mut counts = HostTensor::full(&[e], DType::I32, 0.0);
        let mut offsets = poisoned(&[e + 1], DType::I32);
        let mut ticket = HostTensor::full(&[1], DType::I32, 0.0);
        let grid = moe_count.grid(&cc, [s, 1, 1]);
        moe_count
            .interpret(&cc, grid, &experts, &mut counts, &mut offsets, &mut ticket)
            .expect("interpret");
        assert_eq!(ticket.to_f64_vec(), [0.0], "the ticket is reset");
        let mut cursor = HostTensor::full(&[e], DType::I32, 0.0);
        let mut tokens = poisoned(&[s], DType::I32);
        let mut gates = poisoned(&[s], DType::F32);
        let grid = moe_scatter.grid(&cs, [s, 1, 1]);
        moe_scatter
            .interpret(
                &cs,
                grid,
                &experts,
                &weights,
                &offsets,
                &mut cursor,
                &mut tokens,
                &mut gates,
                topk as i32,
            )
            .expect("interpret");
        let want = moe_grouped(&experts, &weights, e, topk);
        let what = format!(
            "tokens={t} experts={e} top{topk} (KILN_SEED={})",
            rng.seed()
        );
        assert_same_routes(&what, (&offsets, &tokens, &gates), &want);
        assert_eq!(cursor.to_f64_vec(), counts.to_f64_vec(), "{what}: cursors");
        let x = tensor(&mut rng, &[t, h], DType::Bf16, Dist::Normal);
        let w = tensor(&mut rng, &[e, h, n], DType::Bf16, Dist::Normal);
        let init = tensor(&mut rng, &[t, n], DType::F32, Dist::Normal);
        let mut out = init.clone();
        let grid = [e as u32, n.div_ceil(64) as u32, 2];
        moe_experts
            .interpret(&ce, grid, &x, &w, &offsets, &tokens, &gates, &mut out)
            .expect("interpret");
        let reference = moe_reference(&x, &w, &want, &init);
        let case = Case {
            kernel: "moe_count + moe_scatter + moe_experts".into(),
            shape: what.clone(),
            dist: Dist::Normal,
            seed: rng.seed(),
        };
        assert_close(&case, &out, &reference, tolerance(DType::F32) * 10.0);
    }
}
