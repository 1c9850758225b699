//! The kernel library's losses and backward passes on the GPU (sm_80 code on any GPU, sm_90a
//! on Hopper) against f64 references, and on the small shapes against the interpreter:
//! every input distribution, shapes no multiple of the tiles, outputs poisoned with NaN,
//! row-major inputs with padded rows. Skips itself without a GPU.

mod gpu_common;
mod library;

use std::process::ExitCode;

use gpu_common::{Needs, devices, poisoned_output as output, upload_padded};
use kiln_examples::cross_entropy::{
    CrossEntropyBackwardComptime, CrossEntropyComptime, CrossEntropyReduceComptime, cross_entropy,
    cross_entropy_backward, cross_entropy_reduce,
};
use kiln_examples::moe::{
    MoeCountComptime, MoeExpertsComptime, MoeScatterComptime, moe_count, moe_experts, moe_scatter,
};
use kiln_examples::norm_backward::{
    LayerNormBackwardComptime, RmsNormBackwardComptime, SumPartialsComptime, layer_norm_backward,
    rms_norm_backward, sum_partials,
};
use kiln_examples::rotary::{RotaryComptime, rotary};
use kiln_examples::softmax::{SoftmaxBackwardComptime, softmax_backward};
use kiln_ir::dsl::KernelDef;
use kiln_ir::{DType, HostTensor};
use kiln_runtime::{Device, DeviceTensor};
use kiln_tests::check::{
    Case, assert_close, assert_close_to_terms, lse_terms, poisoned, tolerance,
};
use kiln_tests::inputs::{Dist, Rng, tensor};
use kiln_tests::reference;
use library::{
    CROSS_ENTROPY_CONFIGS, GPU_SHAPES, ROTARY_SHAPES, SHAPES, assert_one_column_rms_dx,
    assert_same_routes, f32_tensor, moe_choices, moe_grouped, moe_reference, moe_routes,
    norm_inputs, rotary_tables, targets,
};

fn shapes() -> impl Iterator<Item = ((usize, usize), bool)> {
    SHAPES
        .into_iter()
        .map(|s| (s, true))
        .chain(GPU_SHAPES.into_iter().map(|s| (s, false)))
}

fn case(kernel: String, dev: &Device, m: usize, n: usize, dist: Dist, rng: &Rng) -> Case {
    Case {
        kernel: format!("{kernel} on {}", dev.target()),
        shape: format!("m={m} n={n}"),
        dist,
        seed: rng.seed(),
    }
}

/// The loss, its reduction (sum over int64 targets with a nonnegative `ignore_index`, mean
/// over int32 ones with -100) and the gradient of that reduction, on the GPU against the f64
/// references (and the interpreter on the small shapes).
fn gpu_cross_entropy() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        for dtype in [DType::Bf16, DType::F32] {
            for (bm, bn, nw, stages) in CROSS_ENTROPY_CONFIGS {
                let c = CrossEntropyComptime {
                    BM: bm,
                    BN: bn,
                    NW: nw,
                    STAGES: stages,
                    dtype,
                };
                for ((m, v), small) in shapes() {
                    for (i, dist) in Dist::ALL.into_iter().enumerate() {
                        let (words, ignore, mean) = [(1, -100, true), (2, 1, false)][i % 2];
                        // The reduction as the wrapper runs it (one step) and in
                        // pipelined steps of 256 rows.
                        let (rbm, rnw, rstages) = [(1024, 4, 1), (256, 2, 2)][i / 2 % 2];
                        let cr = CrossEntropyReduceComptime {
                            MEAN: mean,
                            BM: rbm,
                            NW: rnw,
                            STAGES: rstages,
                        };
                        let cb = CrossEntropyBackwardComptime {
                            REDUCED: true,
                            MEAN: mean,
                            BM: bm,
                            BN: bn,
                            NW: nw,
                            STAGES: stages,
                            dtype,
                        };
                        let x = tensor(&mut rng, &[m, v], dtype, dist);
                        let t = targets(&mut rng, m, v, words);
                        let dl = tensor(&mut rng, &[1], DType::F32, Dist::Normal);
                        let grid = cross_entropy.grid(&c, [m, 1, 1]);
                        let (dx_in, dt, ddl) = (
                            upload_padded(&dev, &x, 8),
                            dev.upload(&t).expect("upload"),
                            dev.upload(&dl).expect("upload"),
                        );
                        let (loss, lse, stats) = (
                            output(&dev, DType::F32, &[m]),
                            output(&dev, DType::F32, &[m]),
                            output(&dev, DType::F32, &[2]),
                        );
                        cross_entropy
                            .launch(&dev, &c, grid, &dx_in, &dt, &loss, &lse, ignore)
                            .expect("launch");
                        cross_entropy_reduce
                            .launch(&dev, &cr, [1, 1, 1], &loss, &dt, &stats, ignore)
                            .expect("launch");
                        let dx = output(&dev, dtype, &[m, v]);
                        cross_entropy_backward
                            .launch(
                                &dev, &cb, grid, &dx_in, &dt, &lse, &ddl, &stats, &dx, ignore,
                            )
                            .expect("launch");
                        let (rl, rlse) = reference::cross_entropy(&x, &t, ignore);
                        let k = format!(
                            "cross_entropy {dtype} BM={bm} BN={bn} NW={nw} STAGES={stages} words={words} mean={mean}"
                        );
                        let cs = case(k, &dev, m, v, dist, &rng);
                        let got_loss = loss.download().expect("download");
                        assert_close(&cs, &got_loss, &rl, tolerance(DType::F32) * 10.0);
                        let got_lse = lse.download().expect("download");
                        let terms = lse_terms(&rlse);
                        assert_close_to_terms(&cs, &got_lse, &rlse, &terms, tolerance(DType::F32));
                        let count = (0..m)
                            .filter(|&r| reference::cross_entropy_class(&t, r, ignore).is_some())
                            .count() as f64;
                        let total: f64 = rl.iter().sum();
                        let terms: f64 = rl.iter().map(|l| l.abs()).sum();
                        let got_stats = stats.download().expect("download").to_f64_vec();
                        assert_eq!(got_stats[1], count, "{cs}: counted rows");
                        let g = if mean {
                            dl.data.get_f64(0) / count
                        } else {
                            dl.data.get_f64(0)
                        };
                        if count > 0.0 {
                            let (want, terms) = if mean {
                                (total / count, terms / count)
                            } else {
                                (total, terms)
                            };
                            let got = f32_tensor(&[1], &got_stats[..1]);
                            let tol = tolerance(DType::F32) * 10.0;
                            assert_close_to_terms(&cs, &got, &[want], &[terms], tol);
                        }
                        let rdx = reference::cross_entropy_backward(&x, &t, ignore, &vec![g; m]);
                        let got_dx = dx.download().expect("download");
                        assert_close(&cs, &got_dx, &rdx, tolerance(dtype));
                        if small {
                            let mut li = poisoned(&[m], DType::F32);
                            let mut lsei = poisoned(&[m], DType::F32);
                            cross_entropy
                                .interpret(&c, grid, &x, &t, &mut li, &mut lsei, ignore)
                                .expect("interpret");
                            let vs = Case {
                                kernel: format!("{} (GPU vs interpreter)", cs.kernel),
                                ..cs.clone()
                            };
                            assert_close(&vs, &got_loss, &li.to_f64_vec(), tolerance(DType::F32));
                        }
                    }
                }
            }
        }
    }
}

fn gpu_softmax_backward() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        for dtype in [DType::F32, DType::Bf16] {
            // A row in one tile (read once; at 4352 columns, no power of two, as
            // `row_config` fits 4097) and rows longer than a tile (two loops).
            for (bm, bn, nw) in [(4, 1024, 4), (1, 4096, 4), (1, 8192, 8), (1, 4352, 8)] {
                let c = SoftmaxBackwardComptime {
                    BM: bm,
                    BN: bn,
                    NW: nw,
                    dtype,
                };
                for ((m, n), _) in shapes() {
                    for dist in Dist::ALL {
                        let y = tensor(&mut rng, &[m, n], dtype, dist);
                        let dy = tensor(&mut rng, &[m, n], dtype, Dist::Normal);
                        let grid = softmax_backward.grid(&c, [m, 1, 1]);
                        let dx = output(&dev, dtype, &[m, n]);
                        let (a, b) = (upload_padded(&dev, &y, 3), upload_padded(&dev, &dy, 5));
                        softmax_backward
                            .launch(&dev, &c, grid, &a, &b, &dx)
                            .expect("launch");
                        let k = format!("softmax_backward {dtype} BM={bm} BN={bn} NW={nw}");
                        let cs = case(k, &dev, m, n, dist, &rng);
                        let r = reference::softmax_backward(&y, &dy);
                        let terms = reference::softmax_backward_terms(&y, &dy);
                        let got = dx.download().expect("download");
                        assert_close_to_terms(&cs, &got, &r, &terms, tolerance(dtype));
                    }
                }
            }
        }
    }
}

fn gpu_norm_backwards() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        for dtype in [DType::Bf16, DType::F32] {
            // Rows longer than a tile (all of a block's rows per column tile), rows in one
            // tile walked in groups, and a group taller than the block's rows; two blocks a
            // multiprocessor asked for (`OCC`); 4608 columns, as `norm_backward_config` fits
            // 4097; loops pipelined 2 deep; a long row's column tile asked for (`LC`).
            for (ci, (bm, bn, rb, nw, occ, stages, lc)) in [
                (4, 1024, 16, 8, 1, 1, 0),
                (8, 1024, 4, 8, 2, 1, 0),
                (1, 8192, 4, 16, 1, 1, 0),
                (1, 4608, 16, 16, 2, 1, 0),
                (2, 1024, 8, 8, 1, 2, 0),
                (1, 4096, 8, 16, 1, 1, 1024),
            ]
            .into_iter()
            .enumerate()
            {
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
                // The partials summed as written, as the wrapper sums them (narrow columns,
                // pipelined) and in short pipelined steps over the many partials of RB = 4.
                let (sbm, sbn, sstages) = [(64, 128, 1), (128, 32, 2), (16, 32, 2)][ci % 3];
                let cs_sum = SumPartialsComptime {
                    BM: sbm,
                    BN: sbn,
                    STAGES: sstages,
                    dtype,
                };
                for ((m, n), _) in shapes() {
                    for dist in Dist::ALL {
                        let grid = layer_norm_backward.grid(&c, [m, 1, 1]);
                        let blocks = grid[0] as usize;
                        for rms in [false, true] {
                            let [x, w, mean, rstd, dy] =
                                norm_inputs(&mut rng, m, n, dtype, dist, rms);
                            let up = |t| dev.upload(t).expect("upload");
                            let (dxi, dw, dmean, drstd) = (up(&x), up(&w), up(&mean), up(&rstd));
                            let ddy = upload_padded(&dev, &dy, 2);
                            let dx = output(&dev, dtype, &[m, n]);
                            let dw_part = output(&dev, DType::F32, &[blocks, n]);
                            let db_part = output(&dev, DType::F32, &[blocks, n]);
                            if rms {
                                rms_norm_backward
                                    .launch(&dev, &cr, grid, &dxi, &dw, &drstd, &ddy, &dx, &dw_part)
                                    .expect("launch");
                            } else {
                                layer_norm_backward
                                    .launch(
                                        &dev, &c, grid, &dxi, &dw, &dmean, &drstd, &ddy, &dx,
                                        &dw_part, &db_part,
                                    )
                                    .expect("launch");
                            }
                            let sum = |part: &DeviceTensor| {
                                let out = output(&dev, dtype, &[n]);
                                let g = sum_partials.grid(&cs_sum, [n, 1, 1]);
                                sum_partials
                                    .launch(&dev, &cs_sum, g, part, &out)
                                    .expect("launch");
                                out.download().expect("download")
                            };
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
                            let cs = case(k, &dev, m, n, dist, &rng);
                            let tol = tolerance(dtype) * 4.0;
                            let dxh = dx.download().expect("download");
                            if rms && n == 1 {
                                // One column: all cancellation (see the bound's derivation).
                                assert_one_column_rms_dx(&cs, &dxh, &rdx, &x, &w, &rstd, &dy);
                            } else {
                                assert_close(&cs, &dxh, &rdx, tol);
                            }
                            assert_close(&cs, &sum(&dw_part), &rdw, tol);
                            if !rms {
                                assert_close(&cs, &sum(&db_part), &rdb, tol);
                            }
                        }
                    }
                }
            }
        }
    }
}

fn gpu_rotary() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        for dtype in [DType::Bf16, DType::F16] {
            for (d, r, bh, nw) in [(128, 128, 8, 2), (64, 32, 4, 4), (256, 128, 2, 1)] {
                let c = RotaryComptime {
                    D: d,
                    R: r,
                    BH: bh,
                    NW: nw,
                    dtype,
                };
                let shapes = ROTARY_SHAPES
                    .into_iter()
                    .chain([(4, 1000, 32, 0), (2, 333, 12, 77)]);
                for (b, s, h, offset) in shapes {
                    // The 128k-row shape (many blocks of heads) in one distribution: its inputs
                    // and f64 reference of up to 33M elements a case are the binary's largest
                    // host work (it ran past 240 s); the smaller shapes take every distribution.
                    let dists: &[Dist] = if b * s * h > 100_000 {
                        &[Dist::Normal]
                    } else {
                        &Dist::ALL
                    };
                    for &dist in dists {
                        let x = tensor(&mut rng, &[b, s, h, d], dtype, dist);
                        let (cos, sin) = rotary_tables(s + offset, r, dtype);
                        let grid = rotary.grid(&c, [s, b, h]);
                        let y = output(&dev, dtype, &[b, s, h, d]);
                        let dx = upload_padded(&dev, &x, 8);
                        let (dc, ds) = (
                            dev.upload(&cos).expect("upload"),
                            dev.upload(&sin).expect("upload"),
                        );
                        rotary
                            .launch(&dev, &c, grid, &dx, &dc, &ds, &y, offset as i32)
                            .expect("launch");
                        let k =
                            format!("rotary {dtype} D={d} R={r} BH={bh} NW={nw} offset={offset}");
                        let cs = case(k, &dev, b * s, h * d, dist, &rng);
                        let reference = reference::rotary(&x, &cos, &sin, r, offset);
                        assert_close(
                            &cs,
                            &y.download().expect("download"),
                            &reference,
                            tolerance(dtype),
                        );
                    }
                }
            }
        }
    }
}

/// The MoE expert layer against f64 (the atomic accumulation's order varies from run to run,
/// so no bit comparison with the interpreter): a one-token case, uneven experts (one with
/// none, one with about half the routes), and a layer of realistic proportions; one and
/// several row-block splits.
fn gpu_moe_experts() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        for (bm, bn, bk, dtype) in [(64, 64, 32, DType::Bf16), (64, 32, 16, DType::F16)] {
            let c = MoeExpertsComptime {
                BM: bm,
                BN: bn,
                BK: bk,
                dtype,
            };
            let shapes = [
                (1, 1, 1, 1, 1),
                (37, 5, 2, 100, 70),
                (600, 8, 2, 300, 200),
                (513, 16, 4, 129, 260),
            ];
            for (t, e, topk, h, n) in shapes {
                for dist in [Dist::Uniform, Dist::Normal, Dist::Large] {
                    for split in [1, 4] {
                        let x = tensor(&mut rng, &[t, h], dtype, dist);
                        let w = tensor(&mut rng, &[e, h, n], dtype, dist);
                        let routes = moe_routes(&mut rng, t, e, topk);
                        let init = tensor(&mut rng, &[t, n], DType::F32, Dist::Normal);
                        let up = |t| dev.upload(t).expect("upload");
                        let (dxi, dw, doff, dtok, dgate, dout) = (
                            upload_padded(&dev, &x, 8),
                            up(&w),
                            up(&routes.0),
                            up(&routes.1),
                            up(&routes.2),
                            up(&init),
                        );
                        let grid = [e as u32, n.div_ceil(bn) as u32, split];
                        moe_experts
                            .launch(&dev, &c, grid, &dxi, &dw, &doff, &dtok, &dgate, &dout)
                            .expect("launch");
                        let want = moe_reference(&x, &w, &routes, &init);
                        let k =
                            format!("moe_experts {dtype} BM={bm} BN={bn} BK={bk} split={split}");
                        let cs = case(k, &dev, t * topk, h * n, dist, &rng);
                        let got = dout.download().expect("download");
                        assert_close(&cs, &got, &want, tolerance(DType::F32) * 10.0);
                    }
                }
            }
        }
    }
}

/// The routing on the GPU: `moe_count` (atomics, then the last block's prefix sum behind an
/// acq_rel ticket) and `moe_scatter` group a router's choices exactly as the host does (up
/// to the order within an expert), twice in a row (the ticket resets), and `moe_experts` on
/// them matches the f64 layer.
fn gpu_moe_routing() {
    let mut rng = Rng::from_env();
    for dev in devices() {
        let cc = MoeCountComptime { BLOCK: 256, BE: 64 };
        let cs = MoeScatterComptime { BLOCK: 256 };
        let ce = MoeExpertsComptime {
            BM: 64,
            BN: 64,
            BK: 32,
            dtype: DType::Bf16,
        };
        let ticket = dev
            .upload(&HostTensor::full(&[1], DType::I32, 0.0))
            .expect("upload");
        for (t, e, topk, h, n) in [
            (1, 1, 1, 5, 3),
            (5000, 64, 2, 96, 130),
            (777, 200, 8, 40, 20),
        ] {
            let (experts, weights) = moe_choices(&mut rng, t, e, topk);
            let s = t * topk;
            let up = |x: &HostTensor| dev.upload(x).expect("upload");
            let (dex, dwt) = (up(&experts), up(&weights));
            let zeros = HostTensor::full(&[e], DType::I32, 0.0);
            let (counts, cursor) = (up(&zeros), up(&zeros));
            let offsets = output(&dev, DType::I32, &[e + 1]);
            let tokens = output(&dev, DType::I32, &[s]);
            let gates = output(&dev, DType::F32, &[s]);
            moe_count
                .launch(
                    &dev,
                    &cc,
                    moe_count.grid(&cc, [s, 1, 1]),
                    &dex,
                    &counts,
                    &offsets,
                    &ticket,
                )
                .expect("launch");
            let g = moe_scatter.grid(&cs, [s, 1, 1]);
            moe_scatter
                .launch(
                    &dev,
                    &cs,
                    g,
                    &dex,
                    &dwt,
                    &offsets,
                    &cursor,
                    &tokens,
                    &gates,
                    topk as i32,
                )
                .expect("launch");
            let want = moe_grouped(&experts, &weights, e, topk);
            let what = format!(
                "{} tokens={t} experts={e} top{topk} KILN_SEED={}",
                dev.target(),
                rng.seed()
            );
            let (ho, ht, hg) = (
                offsets.download().expect("download"),
                tokens.download().expect("download"),
                gates.download().expect("download"),
            );
            assert_same_routes(&what, (&ho, &ht, &hg), &want);
            assert_eq!(
                ticket.download().expect("download").to_f64_vec(),
                [0.0],
                "{what}"
            );
            let x = tensor(&mut rng, &[t, h], DType::Bf16, Dist::Normal);
            let w = tensor(&mut rng, &[e, h, n], DType::Bf16, Dist::Normal);
            let init = tensor(&mut rng, &[t, n], DType::F32, Dist::Normal);
            let (dx, dw, dout) = (up(&x), up(&w), up(&init));
            let grid = [e as u32, n.div_ceil(64) as u32, 3];
            moe_experts
                .launch(&dev, &ce, grid, &dx, &dw, &offsets, &tokens, &gates, &dout)
                .expect("launch");
            let reference = moe_reference(&x, &w, &want, &init);
            let cs_case = case(
                "moe routing + experts".into(),
                &dev,
                t,
                n,
                Dist::Normal,
                &rng,
            );
            let got = dout.download().expect("download");
            assert_close(&cs_case, &got, &reference, tolerance(DType::F32) * 10.0);
        }
    }
}

fn main() -> ExitCode {
    gpu_common::run(&[
        ("gpu_library_cross_entropy", Needs::Gpu, gpu_cross_entropy),
        (
            "gpu_library_softmax_backward",
            Needs::Gpu,
            gpu_softmax_backward,
        ),
        ("gpu_library_norm_backwards", Needs::Gpu, gpu_norm_backwards),
        ("gpu_library_rotary", Needs::Gpu, gpu_rotary),
        ("gpu_library_moe_experts", Needs::Gpu, gpu_moe_experts),
        ("gpu_library_moe_routing", Needs::Gpu, gpu_moe_routing),
    ])
}
