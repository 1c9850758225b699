//! Tiles of rank 3 and 4 (`tiles_3d_kernels`): multi-head RMS norm, heads merged and split by
//! `reshape`, `permute`, reductions over every dimension, a rank-4 mean. Each runs on the
//! interpreter against its f64 reference (shapes that are no multiple of any tile, every
//! input distribution, poisoned outputs) and compiles for sm_80 and sm_90a, aligned and not,
//! to PTX that ptxas assembles without spills. Also: what the IR accepts and rejects, at the
//! user's line.

mod tiles_3d_kernels;

use kiln_ir::dsl::{KernelDecl, KernelDef};
use kiln_ir::{DType, HostTensor};
use kiln_tests::check::{Case, as_stored, assert_close, poisoned, sum_tolerance, tolerance};
use kiln_tests::codegen::assembles_clean;
use kiln_tests::inputs::{Dist, Rng, tensor};
use kiln_tests::sweep::{dims, sweep};
use tiles_3d_kernels::*;

/// The marker of an exchange of elements between threads in the PTX.
const EXCHANGE: &str = "layout conversion through shared memory";

#[test]
fn qk_norm_compiles_and_matches_reference() {
    let eps = 1e-6f32;
    for (bt, bh, bd, dtype) in [
        (4, 8, 128, DType::F32),
        (4, 8, 128, DType::Bf16),
        (2, 4, 64, DType::F16),
    ] {
        let c = QkNormComptime {
            BT: bt,
            BH: bh,
            BD: bd,
            dtype,
        };
        assembles_clean(&qk_norm, c, "");
        let shapes = [[1, 1, 1], [3, 5, 7], [9, bh, bd], [7, bh - 1, bd - 28]]
            .map(|[t, h, d]| [t, h.min(bh), d.min(bd)]);
        let kernel = format!("qk_norm BT={bt} BH={bh} BD={bd} {dtype}");
        let mut rng = Rng::from_env();
        sweep(
            &mut rng,
            &kernel,
            shapes,
            &Dist::ALL,
            dims,
            |rng, [t, h, d], case| {
                let x = tensor(rng, &[t, h, d], dtype, case.dist);
                let w = tensor(rng, &[d], dtype, Dist::Normal);
                let mut y = poisoned(&[t, h, d], dtype);
                let grid = qk_norm.grid(&c, [t, 1, 1]);
                qk_norm
                    .interpret(&c, grid, &x, &w, &mut y, eps)
                    .expect("interpret");
                let want = as_stored(&qk_norm_ref(&x, &w, f64::from(eps)), dtype);
                assert_close(case, &y, &want, tolerance(dtype).max(sum_tolerance(d)));
            },
        );
    }
}

#[test]
fn merge_and_split_heads_compile_and_match_reference() {
    for (bb, h, d) in [(8, 4, 64), (2, 8, 32), (4, 2, 128)] {
        let c = MergeHeadsComptime { BB: bb, H: h, D: d };
        // `[b, h, d] -> [b, h * d]` changes the last dimension: the elements move unless
        // the two layouts happen to agree.
        // `[8, 4, 64]`: 16-byte vectors of `[8, 256]` rows are not those of `[8, 4, 64]`.
        let marker = if (bb, h, d) == (8, 4, 64) {
            EXCHANGE
        } else {
            ""
        };
        assembles_clean(&merge_heads, c, marker);
        let s = SplitHeadsComptime { BB: bb, H: h, D: d };
        assembles_clean(&split_heads, s, "");
        let kernel = format!("merge_heads BB={bb} H={h} D={d}");
        let label = |b: usize| format!("b={b}");
        let mut rng = Rng::from_env();
        sweep(
            &mut rng,
            &kernel,
            [1, 3, 2 * bb + 1],
            &Dist::ALL,
            label,
            |rng, b, case| {
                let x = tensor(rng, &[b, h, d], DType::F32, case.dist);
                let mut y = poisoned(&[b, h * d], DType::F32);
                let grid = merge_heads.grid(&c, [b, 1, 1]);
                merge_heads
                    .interpret(&c, grid, &x, &mut y)
                    .expect("interpret");
                assert_close(case, &y, &merge_heads_ref(&x), tolerance(DType::F32));

                let x2 = tensor(rng, &[b, h * d], DType::F32, case.dist);
                let mut y2 = poisoned(&[b, h, d], DType::F32);
                split_heads
                    .interpret(&s, grid, &x2, &mut y2)
                    .expect("interpret");
                let case = Case {
                    kernel: format!("split_heads BB={bb} H={h} D={d}"),
                    ..case.clone()
                };
                assert_close(&case, &y2, &split_heads_ref(&x2, d), tolerance(DType::F32));
            },
        );
    }
}

#[test]
fn permute_heads_compiles_and_matches_reference() {
    for (bb, bh, bd, dtype) in [
        (4, 8, 8, DType::F32),
        (2, 4, 64, DType::Bf16),
        (8, 2, 32, DType::F32),
    ] {
        let c = PermuteHeadsComptime {
            BB: bb,
            BH: bh,
            BD: bd,
            dtype,
        };
        assembles_clean(&permute_heads, c, EXCHANGE);
        let k = permute_heads
            .build(&kiln_ir::dsl::Spec::new(c))
            .expect("build");
        let ir = kiln_ir::print::print_kernel(&k);
        assert!(ir.contains("[1, 0, 2]") && ir.contains("permute %"), "{ir}");
        assert!(ir.contains(&format!("rt<{dtype},{bb}x{bh}x{bd}>")), "{ir}");
        let shapes = [
            [1, 1, 1],
            [3, 5, 7],
            [2 * bb + 3, bh, bd],
            [bb, bh - 1, bd - 1],
        ]
        .map(|[b, h, d]| [b, h.min(bh), d.min(bd)]);
        let kernel = format!("permute_heads BB={bb} BH={bh} BD={bd} {dtype}");
        let mut rng = Rng::from_env();
        sweep(
            &mut rng,
            &kernel,
            shapes,
            &Dist::ALL,
            dims,
            |rng, [b, h, d], case| {
                let x = tensor(rng, &[b, h, d], dtype, case.dist);
                let mut hb = poisoned(&[h, b, d], dtype);
                let mut bdh = poisoned(&[b, d, h], dtype);
                let grid = permute_heads.grid(&c, [b, 1, 1]);
                permute_heads
                    .interpret(&c, grid, &x, &mut hb, &mut bdh)
                    .expect("interpret");
                let (rhb, rbdh) = permute_heads_ref(&x);
                assert_close(case, &hb, &rhb, 0.0);
                assert_close(case, &bdh, &rbdh, 0.0);
            },
        );
    }
}

#[test]
fn reductions_over_every_dimension_compile_and_match_reference() {
    for (bt, bh, bd) in [(4, 8, 8), (8, 4, 32), (2, 16, 64)] {
        let c = ReduceDimsComptime {
            BT: bt,
            BH: bh,
            BD: bd,
        };
        assembles_clean(&reduce_dims, c, "");
        let shapes = [
            [1, 1, 1],
            [3, 5, 7],
            [2 * bt + 1, bh, bd],
            [bt, bh - 1, bd - 3],
        ]
        .map(|[t, h, d]| [t, h.min(bh), d.min(bd)]);
        let kernel = format!("reduce_dims BT={bt} BH={bh} BD={bd}");
        let mut rng = Rng::from_env();
        sweep(
            &mut rng,
            &kernel,
            shapes,
            &Dist::ALL,
            dims,
            |rng, [t, h, d], case| {
                let x = tensor(rng, &[t, h, d], DType::F32, case.dist);
                let blocks = t.div_ceil(bt);
                let mut s = poisoned(&[blocks, h, d], DType::F32);
                let mut mx = poisoned(&[t, d], DType::F32);
                let mut mn = poisoned(&[t, h], DType::F32);
                let grid = reduce_dims.grid(&c, [t, 1, 1]);
                reduce_dims
                    .interpret(&c, grid, &x, &mut s, &mut mx, &mut mn)
                    .expect("interpret");
                let (rs, rmx, rmn) = reduce_dims_ref(&x, bt);
                assert_close(case, &s, &rs, sum_tolerance(bt));
                assert_close(case, &mx, &rmx, 0.0);
                assert_close(case, &mn, &rmn, 0.0);
            },
        );
    }
}

#[test]
fn rank_4_tiles_compile_and_match_reference() {
    for (bh, bs, bd) in [(4, 8, 16), (2, 32, 4), (8, 4, 64)] {
        let c = CenterSeqComptime {
            BH: bh,
            BS: bs,
            BD: bd,
        };
        assembles_clean(&center_seq, c, "");
        let shapes = [[1, 1, 1, 1], [3, 3, 5, 7], [2, bh, bs, bd]]
            .map(|[b, h, s, d]| [b, h.min(bh), s.min(bs), d.min(bd)]);
        let kernel = format!("center_seq BH={bh} BS={bs} BD={bd}");
        let mut rng = Rng::from_env();
        sweep(
            &mut rng,
            &kernel,
            shapes,
            &Dist::ALL,
            dims,
            |rng, [b, h, s, d], case| {
                let x = tensor(rng, &[b, h, s, d], DType::F32, case.dist);
                let mut y = poisoned(&[b, h, s, d], DType::F32);
                let grid = center_seq.grid(&c, [b, 1, 1]);
                center_seq
                    .interpret(&c, grid, &x, &mut y)
                    .expect("interpret");
                // Cancellation: the error is relative to the inputs, not the centred result.
                let xn = x.to_f64_vec().iter().map(|v| v * v).sum::<f64>().sqrt();
                let rn = center_seq_ref(&x).iter().map(|v| v * v).sum::<f64>().sqrt();
                let tol = sum_tolerance(s) * (xn / rn.max(f64::MIN_POSITIVE)).max(1.0);
                assert_close(case, &y, &center_seq_ref(&x), tol);
            },
        );
    }
}

#[test]
fn leading_extents_that_are_no_power_of_two_compile_and_match_reference() {
    for (bb, bs, bd) in [(2, 96, 32), (4, 96, 8), (1, 192, 16)] {
        let c = SubMaxMidComptime {
            BB: bb,
            BS: bs,
            BD: bd,
        };
        assembles_clean(&sub_max_mid, c, "");
        let shapes = [[1, 1, 1], [3, 50, 7], [2 * bb + 1, bs, bd]]
            .map(|[b, s, d]| [b, s.min(bs), d.min(bd)]);
        let kernel = format!("sub_max_mid BB={bb} BS={bs} BD={bd}");
        let mut rng = Rng::from_env();
        sweep(
            &mut rng,
            &kernel,
            shapes,
            &Dist::ALL,
            dims,
            |rng, [b, s, d], case| {
                let x = tensor(rng, &[b, s, d], DType::F32, case.dist);
                let mut y = poisoned(&[b, s, d], DType::F32);
                let grid = sub_max_mid.grid(&c, [b, 1, 1]);
                sub_max_mid
                    .interpret(&c, grid, &x, &mut y)
                    .expect("interpret");
                assert_close(case, &y, &sub_max_mid_ref(&x), tolerance(DType::F32));
            },
        );
    }
}

#[test]
fn register_transposes_compile_and_match_reference() {
    for (bm, bn, dtype) in [
        (32, 64, DType::F32),
        (64, 16, DType::Bf16),
        (8, 128, DType::F32),
    ] {
        let c = TransposeTileComptime {
            BM: bm,
            BN: bn,
            dtype,
        };
        assembles_clean(&transpose_tile, c, EXCHANGE);
        let shapes = [[1, 1], [3, 5], [2 * bm + 1, bn + 3], [bm, 3 * bn]];
        let kernel = format!("transpose_tile BM={bm} BN={bn} {dtype}");
        let mut rng = Rng::from_env();
        sweep(
            &mut rng,
            &kernel,
            shapes,
            &Dist::ALL,
            dims,
            |rng, [m, n], case| {
                let x = tensor(rng, &[m, n], dtype, case.dist);
                let mut y = poisoned(&[n, m], dtype);
                let mut z = poisoned(&[n, 1, m], dtype);
                let grid = transpose_tile.grid(&c, [m, n, 1]);
                transpose_tile
                    .interpret(&c, grid, &x, &mut y, &mut z)
                    .expect("interpret");
                let (ry, rz) = transpose_tile_ref(&x);
                assert_close(case, &y, &as_stored(&ry, dtype), tolerance(dtype));
                assert_close(case, &z, &rz, 0.0);
            },
        );
    }
}

#[test]
fn lower_ranks_broadcast_by_numpys_rule() {
    for (bt, bh, bd) in [(2, 8, 32), (4, 2, 128), (1, 16, 8)] {
        let c = BroadcastRanksComptime {
            BT: bt,
            BH: bh,
            BD: bd,
        };
        assembles_clean(&broadcast_ranks, c, "");
        let shapes =
            [[1, 1, 1], [3, 5, 7], [2 * bt + 1, bh, bd]].map(|[t, h, d]| [t, h.min(bh), d.min(bd)]);
        let kernel = format!("broadcast_ranks BT={bt} BH={bh} BD={bd}");
        let mut rng = Rng::from_env();
        sweep(
            &mut rng,
            &kernel,
            shapes,
            &Dist::ALL,
            dims,
            |rng, [t, h, d], case| {
                let x = tensor(rng, &[t, h, d], DType::F32, case.dist);
                let b = tensor(rng, &[d], DType::F32, case.dist);
                let g = tensor(rng, &[h, d], DType::F32, case.dist);
                let mut y = poisoned(&[t, h, d], DType::F32);
                let grid = broadcast_ranks.grid(&c, [t, 1, 1]);
                broadcast_ranks
                    .interpret(&c, grid, &x, &b, &g, &mut y)
                    .expect("interpret");
                let want = broadcast_ranks_ref(&x, &b, &g);
                assert_close(case, &y, &want, tolerance(DType::F32));
            },
        );
    }
}

/// The pass pipeline rewrites loads and stores of 3-D tiles into addressed accesses (a
/// bounded store into a masked one): the kernel verifies after every pass on both targets
/// and still interprets to what the kernel as written does.
#[test]
fn the_pipeline_keeps_the_semantics_of_3d_loads_and_stores() {
    use kiln_ir::interp::{HostArg, run};
    use kiln_ir::passes::run_pipeline;
    use kiln_ir::verify::verify;
    let c = KeepHeadsComptime {
        BT: 2,
        BH: 8,
        BD: 32,
    };
    assembles_clean(&keep_heads, c, "");
    let mut rng = Rng::from_env();
    for target in [kiln_ir::Target::Sm80, kiln_ir::Target::Sm90a] {
        for aligned in [false, true] {
            let spec = kiln_ir::dsl::Spec::uniform(c, keep_heads.signature(), aligned);
            let built = keep_heads.build(&spec).expect("build");
            let mut k = built.clone();
            let mut broken = Vec::new();
            run_pipeline(&mut k, target, &mut |pass, k| {
                if let Err(e) = verify(k) {
                    broken.push(format!("after `{pass}`: {e}"));
                }
            })
            .unwrap_or_else(|d| panic!("{d}"));
            assert!(broken.is_empty(), "{}", broken.join("\n"));
            let printed = kiln_ir::print::print_kernel(&k);
            assert!(printed.contains("scatter"), "{printed}");
            for (t, h, d, keep) in [(3, 5, 7, 2), (5, 8, 32, 9), (4, 8, 30, -1), (1, 1, 1, 1)] {
                let x = tensor(&mut rng, &[t, h, d], DType::F32, Dist::Normal);
                let grid = keep_heads.grid(&c, [t, 1, 1]);
                // Heads at or past `keep` keep what `y` held.
                let init = tensor(&mut rng, &[t, h, d], DType::F32, Dist::Uniform);
                let (mut want, mut got) = (init.clone(), init.clone());
                for (kernel, out) in [(&built, &mut want), (&k, &mut got)] {
                    let mut args = [
                        HostArg::Tensor(&x),
                        HostArg::TensorMut(out),
                        HostArg::I32(keep),
                    ];
                    run(kernel, grid, &mut args).expect("interpret");
                }
                let case = Case {
                    kernel: format!("keep_heads after the pipeline for {target}"),
                    shape: format!("[{t}, {h}, {d}] keep={keep}"),
                    dist: Dist::Normal,
                    seed: rng.seed(),
                };
                let old = init.to_f64_vec();
                let reference: Vec<f64> = x
                    .to_f64_vec()
                    .iter()
                    .enumerate()
                    .map(|(i, v)| {
                        if (i / d) % h < keep.max(0) as usize {
                            v * 3.0
                        } else {
                            old[i]
                        }
                    })
                    .collect();
                // The kernel as written matches the reference, and the pipeline's matches it.
                assert_close(&case, &want, &reference, tolerance(DType::F32));
                assert_close(&case, &got, &want.to_f64_vec(), 0.0);
            }
        }
    }
}

#[test]
fn loop_carried_3d_tiles_compile_and_match_reference() {
    for (bt, bh, bd) in [(2, 8, 64), (4, 4, 32), (1, 2, 128)] {
        let c = ChunkStatsComptime {
            BT: bt,
            BH: bh,
            BD: bd,
        };
        assembles_clean(&chunk_stats, c, "");
        let shapes =
            [[1, 1, 1], [3, 5, 7], [2 * bt + 1, bh, 3 * bd + 5]].map(|[t, h, d]| [t, h.min(bh), d]);
        let kernel = format!("chunk_stats BT={bt} BH={bh} BD={bd}");
        let mut rng = Rng::from_env();
        sweep(
            &mut rng,
            &kernel,
            shapes,
            &Dist::ALL,
            dims,
            |rng, [t, h, d], case| {
                let x = tensor(rng, &[t, h, d], DType::F32, case.dist);
                let mut s = poisoned(&[t, h], DType::F32);
                let mut mx = poisoned(&[t, h], DType::F32);
                let grid = chunk_stats.grid(&c, [t, 1, 1]);
                chunk_stats
                    .interpret(&c, grid, &x, &mut s, &mut mx)
                    .expect("interpret");
                let (rs, rm) = chunk_stats_ref(&x);
                assert_close(case, &s, &rs, sum_tolerance(d));
                assert_close(case, &mx, &rm, 0.0);
            },
        );
    }
}

/// A 3-D tile whose reshape keeps its last dimension keeps every element in its register:
/// no exchange.
#[test]
fn a_reshape_keeping_the_last_dimension_moves_nothing() {
    use kiln::prelude::*;
    #[kernel(grid = [BB, 1, 1])]
    fn fold_rows(
        x: Tensor<f32, 3>,
        y: TensorMut<f32, 2>,
        #[comptime(default = 4)] BB: usize,
        #[comptime(default = 8)] H: usize,
        #[comptime(default = 64)] D: usize,
    ) {
        let b0 = block_id().x * BB;
        let t = x.tile([BB, H, D], [b0, 0, 0]).load();
        y.tile([BB * H, D], [b0 * H, 0])
            .store(exp(&t).reshape([BB * H, D]));
    }
    let c = FoldRowsComptime { BB: 4, H: 8, D: 64 };
    assembles_clean(&fold_rows, c, "");
    let spec = kiln_ir::dsl::Spec::uniform(c, fold_rows.signature(), true);
    let k = fold_rows.build(&spec).expect("build");
    for target in [kiln_ir::Target::Sm80, kiln_ir::Target::Sm90a] {
        let m = kiln_ptx::compile(&k, target).expect("compile");
        assert!(!m.ptx.contains(EXCHANGE), "{target}: {}", m.ptx);
        assert!(!m.ptx.contains("bar.sync"), "{target}");
        // The 3-D load reads 16 bytes a thread along the contiguous last dimension (as an
        // addressed access: `ld.global`, where plain 2-D loads read through `.nc`).
        assert!(m.ptx.contains("ld.global.v4.f32"), "{target}: {}", m.ptx);
    }
    let mut rng = Rng::from_env();
    let x = tensor(&mut rng, &[5, 8, 64], DType::F32, Dist::Normal);
    let mut y = poisoned(&[40, 64], DType::F32);
    fold_rows
        .interpret(&c, fold_rows.grid(&c, [5, 1, 1]), &x, &mut y)
        .expect("interpret");
    let want: Vec<f64> = x.to_f64_vec().iter().map(|v| v.exp()).collect();
    let case = Case {
        kernel: "fold_rows".into(),
        shape: "[5, 8, 64]".into(),
        dist: Dist::Normal,
        seed: rng.seed(),
    };
    assert_close(&case, &y, &want, 1e-5);
}

/// What the IR rejects about tiles of more dimensions, at the user's line, in its words.
#[test]
fn misuse_is_reported_at_the_users_line() {
    use kiln::prelude::*;
    #[kernel(grid = [4, 1, 1])]
    fn bad_mma(x: Tensor<bf16, 3>, y: TensorMut<f32, 2>) {
        let a = x.tile([2, 16, 16], [0, 0, 0]).load();
        let b = x.tile([16, 16], [0, 0, 0]).load();
        y.tile([16, 16], [0, 0]).store(mma(&a, &b));
    }
    #[kernel(grid = [4, 1, 1])]
    fn bad_reshape(x: Tensor<f32, 3>, y: TensorMut<f32, 2>) {
        let a = x.tile([2, 16, 16], [0, 0, 0]).load();
        y.tile([16, 16], [0, 0]).store(a.reshape([16, 16]));
    }
    #[kernel(grid = [4, 1, 1])]
    fn bad_permute(x: Tensor<f32, 3>, y: TensorMut<f32, 3>) {
        let a = x.tile([2, 16, 16], [0, 0, 0]).load();
        y.tile([2, 16, 16], [0, 0, 0]).store(a.permute([0, 1, 1]));
    }
    #[kernel(grid = [4, 1, 1])]
    fn bad_reduce(x: Tensor<f32, 3>, y: TensorMut<f32, 2>) {
        let a = x.tile([2, 16, 16], [0, 0, 0]).load();
        y.tile([16, 16], [0, 0]).store(reduce_sum(&a, 3));
    }
    #[kernel(grid = [4, 1, 1])]
    fn too_many_dims(x: Tensor<f32, 3>, y: TensorMut<f32, 3>) {
        let a = zeros::<f32>([2, 2, 2, 2, 2]);
        y.tile([2, 2, 2], [0, 0, 0]).store(a);
        let _ = x;
    }
    #[kernel(grid = [4, 1, 1])]
    fn too_many_elements(y: TensorMut<f32, 3>) {
        let a = zeros::<f32>([4096, 4096, 2]);
        y.tile([4096, 4096, 2], [0, 0, 0]).store(a);
    }
    #[kernel(grid = [4, 1, 1])]
    fn too_wide(y: TensorMut<f32, 3>) {
        let a = zeros::<f32>([1usize << 40, 1usize << 40, 1usize << 40]);
        y.tile([2, 2, 2], [0, 0, 0]).store(a);
    }
    let cases: [(&dyn Fn() -> String, &str); 7] = [
        (&|| err(&bad_mma), "`mma` multiplies 2-D tiles"),
        (&|| err(&bad_reshape), "keeps the element count"),
        (&|| err(&bad_permute), "must name each of"),
        (&|| err(&bad_reduce), "along dimension 3"),
        (&|| err(&too_many_dims), "tiles have 1 to 4 dimensions"),
        (&|| err(&too_many_elements), "a tile holds at most"),
        (
            &|| err(&too_wide),
            "must be a power of two or a multiple of 16",
        ),
    ];
    for (e, want) in cases {
        let e = e();
        assert!(e.contains(want), "{e}");
        assert!(e.contains("tiles_3d.rs"), "not at the user's line: {e}");
    }
}

fn err<D: KernelDef>(def: &D) -> String
where
    D::Comptime: Default,
{
    match def.build(&kiln_ir::dsl::Spec::new(D::Comptime::default())) {
        Ok(_) => panic!("{} built", def.name()),
        Err(e) => e.to_string(),
    }
}

/// The interpreter's values of the shape ops agree with numpy's on a small example.
#[test]
fn host_tensor_helpers_are_row_major() {
    let x = HostTensor::from_fn(&[2, 3, 4], DType::F32, |i| i as f64);
    let (hb, bdh) = permute_heads_ref(&x);
    assert_eq!(hb[4], 12.0); // hb[1, 0, 0] = x[0, 1, 0]
    assert_eq!(bdh[1], 4.0); // bdh[0, 0, 1] = x[0, 1, 0]
}
