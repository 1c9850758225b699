//! Warp-specialised rings with a B operand loaded once before the loop and held in shared
//! memory (`wgmma_kernels::ring_held_b`) or one stage load read by two operands, K- and
//! MN-major (`ring_shared_b`), or an A read transposed from its stage (MN-major,
//! `wgmma_transposed`), checked on the CPU: the plan's loads, the protocol proved, the
//! schedule's CPU execution (`run_scheduled`) and the interpreter against f64, both ptxas
//! without spills. The GPU run: `gpu_wgmma_general.rs`.

mod wgmma_kernels;

use kiln_ir::dsl::{KernelDef, Spec};
use kiln_ir::interp::{HostArg, run_def, run_scheduled};
use kiln_ir::passes::run_pipeline;
use kiln_ir::sched::tma::Operand;
use kiln_ir::{DType, HostTensor, Kernel, Target};
use kiln_ptx::ptxas::{self, Tool};
use kiln_tests::check::{Case, assert_close, poisoned, tolerance};
use kiln_tests::inputs::{Dist, Rng, tensor};
use wgmma_kernels::{
    RingStagedAComptime, WgmmaTransposedComptime, gemm_tt, held_b, ring_held_b,
    ring_held_b_configs, ring_shared_b, ring_shared_b_configs, ring_staged_a,
    ring_staged_a_configs, shared_b, staged_a, wgmma_transposed,
};

/// `def` with comptime values `ct`, built for aligned tensors.
fn build<D: KernelDef>(def: &D, ct: D::Comptime) -> Kernel
where
    D::Comptime: std::fmt::Debug + Copy,
{
    let spec = Spec::uniform(ct, def.signature(), true);
    def.build(&spec).unwrap_or_else(|e| panic!("{ct:?}: {e}"))
}

/// `def` after every pass for sm_90a.
fn scheduled<D: KernelDef>(def: &D, ct: D::Comptime) -> Kernel
where
    D::Comptime: std::fmt::Debug + Copy,
{
    let mut k = build(def, ct);
    run_pipeline(&mut k, Target::Sm90a, &mut |_, _| {}).unwrap_or_else(|d| panic!("{ct:?}: {d}"));
    k
}

/// `def`'s sm_90a PTX runs its mmas on wgmma and both ptxas releases assemble it unspilled.
fn assert_assembles<D: KernelDef>(def: &D, ct: D::Comptime)
where
    D::Comptime: std::fmt::Debug + Copy,
{
    let m = kiln_ptx::compile(&build(def, ct), Target::Sm90a).expect("compiles");
    assert!(m.ptx.contains("wgmma.mma_async"), "{ct:?}: wgmma");
    for tool in [Tool::Ptxas, Tool::JitPtxas] {
        let report = ptxas::check_with(tool, &m.ptx, Target::Sm90a)
            .unwrap_or_else(|e| panic!("{ct:?} {tool:?}: {e}"));
        assert!(!report.spills(), "{ct:?} {tool:?} spills: {report}");
    }
}

/// Each TMA load of `k`'s ring: whether it is a once load, and the operand it is planned as.
fn planned_loads(k: &Kernel) -> Vec<(bool, Operand)> {
    let s = k.schedule.sched.as_ref().expect("a ring");
    s.loads
        .iter()
        .map(|(h, l)| (s.once(h), l.tma.operand))
        .collect()
}

#[test]
fn the_weight_is_a_once_load_of_the_ring() {
    for ct in ring_held_b_configs() {
        let loads = planned_loads(&scheduled(&ring_held_b, ct));
        let b = if ct.WT {
            Operand::KMajorB
        } else {
            Operand::MnMajorB
        };
        assert_eq!(
            loads,
            [(false, Operand::KMajorA), (true, b)],
            "{ct:?}: the row tiles per stage, the weight once"
        );
    }
}

#[test]
fn scheduled_and_interpreted_match_reference() {
    let mut rng = Rng::from_env();
    for ct in ring_held_b_configs() {
        let kernel = scheduled(&ring_held_b, ct);
        // Row counts no multiple of the tile (the last tile's rows read as 0), and N past the
        // blocks' columns.
        for (rows, n) in [(300, 130), (64, 64), (5, 200)] {
            for dist in [Dist::Normal, Dist::Large] {
                let a = tensor(&mut rng, &[rows, ct.K], DType::Bf16, dist);
                let w_shape = if ct.WT { [n, ct.K] } else { [ct.K, n] };
                let w = tensor(&mut rng, &w_shape, DType::Bf16, dist);
                let want = held_b(&a, &w, ct.BM, ct.WT);
                let grid = [n.div_ceil(ct.BN) as u32, 1, 1];
                let case = Case {
                    kernel: format!("ring_held_b {ct:?}"),
                    shape: format!("rows={rows} n={n}"),
                    dist,
                    seed: rng.seed(),
                };
                let mut c = poisoned(&[ct.BM, n], DType::F32);
                let mut args = [
                    HostArg::Tensor(&a),
                    HostArg::Tensor(&w),
                    HostArg::TensorMut(&mut c),
                ];
                run_scheduled(&kernel, grid, 2, &mut args)
                    .unwrap_or_else(|e| panic!("{ct:?}: {e}"));
                assert_close(&case, &c, &want, tolerance(DType::Bf16));
                let mut ci = poisoned(&[ct.BM, n], DType::F32);
                let mut args = [
                    HostArg::Tensor(&a),
                    HostArg::Tensor(&w),
                    HostArg::TensorMut(&mut ci),
                ];
                run_def(&ring_held_b, &ct, grid, &mut args).expect("interprets");
                assert_close(&case, &ci, &want, tolerance(DType::Bf16));
            }
        }
    }
}

#[test]
fn both_ptxas_assemble_without_spills() {
    for ct in ring_held_b_configs() {
        assert_assembles(&ring_held_b, ct);
    }
}

#[test]
fn one_stage_load_serves_both_readers_of_a_tile() {
    for ct in ring_shared_b_configs() {
        let k = scheduled(&ring_shared_b, ct);
        let loads = planned_loads(&k);
        let s = k.schedule.sched.as_ref().expect("a ring");
        // k per stage, one load (its first use, K-major B, names it); q once (A).
        assert_eq!(
            loads,
            [(false, Operand::KMajorB), (true, Operand::KMajorA)],
            "{ct:?}"
        );
        // Not rotated: the head and the tail read the same stage.
        assert!(s.overlap.is_none(), "{ct:?}: rotated");
    }
}

#[test]
fn shared_loads_run_and_assemble() {
    let mut rng = Rng::from_env();
    for ct in ring_shared_b_configs() {
        let kernel = scheduled(&ring_shared_b, ct);
        for (m, rows) in [(100, 150), (64, 64), (3, 200)] {
            for dist in [Dist::Normal, Dist::Uniform] {
                let q = tensor(&mut rng, &[m, ct.D], DType::Bf16, dist);
                let k = tensor(&mut rng, &[rows, ct.D], DType::Bf16, dist);
                let want = shared_b(&q, &k);
                let grid = [m.div_ceil(ct.BM) as u32, 1, 1];
                let case = Case {
                    kernel: format!("ring_shared_b {ct:?}"),
                    shape: format!("m={m} rows={rows}"),
                    dist,
                    seed: rng.seed(),
                };
                let mut o = poisoned(&[m, ct.D], DType::F32);
                let mut args = [
                    HostArg::Tensor(&q),
                    HostArg::Tensor(&k),
                    HostArg::TensorMut(&mut o),
                ];
                run_scheduled(&kernel, grid, 2, &mut args)
                    .unwrap_or_else(|e| panic!("{ct:?}: {e}"));
                assert_close(&case, &o, &want, tolerance(DType::Bf16));
                let mut oi = poisoned(&[m, ct.D], DType::F32);
                let mut args = [
                    HostArg::Tensor(&q),
                    HostArg::Tensor(&k),
                    HostArg::TensorMut(&mut oi),
                ];
                run_def(&ring_shared_b, &ct, grid, &mut args).expect("interprets");
                assert_close(&case, &oi, &want, tolerance(DType::Bf16));
            }
        }
        assert_assembles(&ring_shared_b, ct);
    }
}

/// A ring whose consumers stage an A operand (`t.t()` of a register tile) through shared
/// memory: planned as a staged operand of the ring (not rotated), its schedule's CPU
/// execution and the interpreter match f64, and both ptxas assemble it unspilled with the
/// wgmma reading it MN-major (`imm-trans-a` 1) between the consumers' own barriers.
#[test]
fn staged_a_runs_and_assembles() {
    let mut rng = Rng::from_env();
    for ct in ring_staged_a_configs() {
        let kernel = scheduled(&ring_staged_a, ct);
        let s = kernel.schedule.sched.as_ref().expect("a ring");
        assert!(s.overlap.is_none(), "{ct:?}: rotated");
        assert_eq!(kernel.schedule.staged.len(), 1, "{ct:?}: one staged A");
        // No other barrier of the body follows the wait for the staged A's wgmma (the
        // store reading its result meets no one), so its write keeps its first barrier.
        assert!(
            kernel.schedule.implied_barriers.staged.is_empty(),
            "{ct:?}: the staged A's first barrier left out"
        );
        for (m, n) in [(150, ct.BN), (64, ct.BN - 14), (5, 3)] {
            for dist in [Dist::Normal, Dist::Uniform] {
                let q = tensor(&mut rng, &[m, ct.D], DType::Bf16, dist);
                let k = tensor(&mut rng, &[n, ct.D], DType::Bf16, dist);
                let (want_q, want_k) = staged_a(&q, &k);
                let case = Case {
                    kernel: format!("ring_staged_a {ct:?}"),
                    shape: format!("m={m} n={n}"),
                    dist,
                    seed: rng.seed(),
                };
                for run in ["scheduled", "interpreted"] {
                    let mut oq = poisoned(&[m, ct.D], DType::F32);
                    let mut ok = poisoned(&[n, ct.D], DType::F32);
                    let mut args = [
                        HostArg::Tensor(&q),
                        HostArg::Tensor(&k),
                        HostArg::TensorMut(&mut oq),
                        HostArg::TensorMut(&mut ok),
                    ];
                    if run == "scheduled" {
                        run_scheduled(&kernel, [1, 1, 1], 2, &mut args)
                            .unwrap_or_else(|e| panic!("{ct:?}: {e}"));
                    } else {
                        run_def(&ring_staged_a, &ct, [1, 1, 1], &mut args).expect("interprets");
                    }
                    assert_close(&case, &oq, &want_q, tolerance(DType::Bf16));
                    assert_close(&case, &ok, &want_k, tolerance(DType::Bf16));
                }
            }
        }
        assert_assembles(&ring_staged_a, ct);
        let ptx = kiln_ptx::compile(&build(&ring_staged_a, ct), Target::Sm90a)
            .expect("compiles")
            .ptx;
        let threads = 32 * ct.NW;
        // Past the set-up's block-wide barrier, only the consumers' own, around the writes.
        let after_setup = ptx.split_once("bar.sync 0;").map_or("", |(_, rest)| rest);
        assert!(
            after_setup
                .matches(&format!("bar.sync 1, {threads};"))
                .count()
                == 2
                && !after_setup.contains("bar.sync 0;")
                && after_setup.contains("fence.proxy.async.shared::cta"),
            "{ct:?}: the consumers' own barriers around the staging: {}",
            ptx.lines()
                .filter(|l| l.contains("bar.") || l.contains("fence"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        assert!(
            // The SS form (A from a descriptor, not `{..}` registers), `imm-trans-a` its
            // second-to-last field.
            ptx.lines().any(|l| l.contains("wgmma.mma_async")
                && !l.contains("}, {")
                && l.trim_end_matches(';').rsplit(", ").nth(1) == Some("1")),
            "{ct:?}: a wgmma reading A MN-major: {}",
            ptx.lines()
                .filter(|l| l.contains("wgmma.mma_async"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

/// `warp_specialize(false)` keeps a kernel the ring would take on the plain lowering (wgmma
/// issued by every warpgroup, cp.async), says so in a note, and computes the same.
#[test]
fn warp_specialisation_turned_off_keeps_the_plain_lowering() {
    let ct = RingStagedAComptime {
        WS: false,
        ..RingStagedAComptime::default()
    };
    let kernel = scheduled(&ring_staged_a, ct);
    assert!(kernel.schedule.sched.is_none(), "a ring");
    // The IR says so (and so keys the disk cache apart from the warp-specialised build).
    assert!(kiln_ir::print::print_kernel(&kernel).contains(" warp_specialize=false {"));
    assert!(
        kernel
            .schedule
            .notes
            .iter()
            .any(|n| n.text.contains("`warp_specialize(false)`")),
        "{:?}",
        kernel.schedule.notes
    );
    let ptx = kiln_ptx::compile(&build(&ring_staged_a, ct), Target::Sm90a)
        .expect("compiles")
        .ptx;
    assert!(ptx.contains("wgmma.mma_async") && !ptx.contains("setmaxnreg"));
    let mut rng = Rng::from_env();
    let q = tensor(&mut rng, &[100, ct.D], DType::Bf16, Dist::Normal);
    let k = tensor(&mut rng, &[50, ct.D], DType::Bf16, Dist::Normal);
    let (want_q, want_k) = staged_a(&q, &k);
    let mut oq = poisoned(&[100, ct.D], DType::F32);
    let mut ok = poisoned(&[50, ct.D], DType::F32);
    let mut args = [
        HostArg::Tensor(&q),
        HostArg::Tensor(&k),
        HostArg::TensorMut(&mut oq),
        HostArg::TensorMut(&mut ok),
    ];
    run_def(&ring_staged_a, &ct, [1, 1, 1], &mut args).expect("interprets");
    let case = Case {
        kernel: format!("ring_staged_a {ct:?}"),
        shape: "m=100 n=50".into(),
        dist: Dist::Normal,
        seed: rng.seed(),
    };
    assert_close(&case, &oq, &want_q, tolerance(DType::Bf16));
    assert_close(&case, &ok, &want_k, tolerance(DType::Bf16));
}

/// Attention backward's inputs for `b` batches of `h` query heads over `hk` key/value heads,
/// head dim `d`: q, k, v, dout (bf16, normal) and the row statistics lse and delta in the
/// range a forward gives (any values exercise the same data flow).
fn backward_inputs(
    rng: &mut Rng,
    (b, h, hk): (usize, usize, usize),
    (sq, sk, d): (usize, usize, usize),
) -> [HostTensor; 6] {
    let mut t = |heads, s| tensor(rng, &[b, heads, s, d], DType::Bf16, Dist::Normal);
    let (q, k, v, dout) = (t(h, sq), t(hk, sk), t(hk, sk), t(h, sq));
    let mut stat = || tensor(rng, &[b, h, sq], DType::F32, Dist::Uniform);
    let (lse, delta) = (stat(), stat());
    [q, k, v, dout, lse, delta]
}

/// [`backward_inputs`] as the first six arguments of a backward kernel.
fn input_args(inputs: &[HostTensor; 6]) -> Vec<HostArg<'_>> {
    inputs.iter().map(HostArg::Tensor).collect()
}

/// Attention's deterministic dQ walk (`attention_bwd_dq`) on sm_90a: its K tile feeds the
/// scores (K-major) and dQ (MN-major) from one stage, Q and dO are held once, so it takes a
/// warp-specialised ring; the schedule's CPU execution equals the interpreter's dQ, causal
/// and not, d = 64 and 128, lengths no multiple of the blocks.
#[test]
fn the_dq_walk_takes_a_ring_and_its_schedule_computes_the_interpreters_dq() {
    use kiln_examples::attention_backward::{AttentionBwdParams, attention_bwd_dq};
    let mut rng = Rng::from_env();
    for (d, causal) in [(64, false), (128, true), (64, true)] {
        let p = AttentionBwdParams {
            d,
            causal,
            deterministic: true,
            ..AttentionBwdParams::default()
        };
        let kernel = scheduled(&attention_bwd_dq, p);
        assert!(kernel.schedule.sched.is_some(), "d={d}: no ring");
        let (b, h, sq, sk) = (1, 2, 150, 130);
        let inputs = backward_inputs(&mut rng, (b, h, h), (sq, sk, d));
        let grid = p.dq_grid([sq, h, b]);
        let scale = 0.1f32;
        let run = |scheduled: bool| {
            let mut dq = poisoned(&[b, h, sq, d], DType::Bf16);
            let mut args = input_args(&inputs);
            args.extend([HostArg::TensorMut(&mut dq), HostArg::F32(scale)]);
            if scheduled {
                run_scheduled(&kernel, grid, 2, &mut args).unwrap_or_else(|e| panic!("d={d}: {e}"));
            } else {
                run_def(&attention_bwd_dq, &p, grid, &mut args).expect("interprets");
            }
            dq
        };
        let (got, want) = (run(true), run(false));
        let case = Case {
            kernel: format!("scheduled attention_bwd_dq d={d} causal={causal}"),
            shape: format!("b={b} h={h} sq={sq} sk={sk}"),
            dist: Dist::Normal,
            seed: rng.seed(),
        };
        assert_close(&case, &got, &want.to_f64_vec(), tolerance(DType::Bf16));
    }
}

/// Attention's deterministic dK/dV walk (`attention_bwd_dkdv` with `deterministic`) on
/// sm_90a: keys-major (`S^T = K Q^T`), K and V held once as A, Q's and dO's stage tiles each
/// read K-major (the scores) and MN-major (dK, dV), P^T and dS^T register A operands, so it
/// takes a warp-specialised ring; the schedule's CPU execution equals the interpreter's dK
/// and dV: causal and not, a window with a soft-cap, grouped heads, column chunks (d = 256
/// in four of 64), lengths no multiple of the blocks. With `keys_major` and atomics too:
/// dQ's adds from the consumers' staged dS equal the interpreter's (with two consumer
/// warpgroups, dQ's columns split between them).
#[test]
fn the_dkdv_walk_takes_a_ring_and_its_schedule_computes_the_interpreters_dk_and_dv() {
    use kiln_examples::attention_backward::{AttentionBwdParams, attention_bwd_dkdv};
    let mut rng = Rng::from_env();
    let base = AttentionBwdParams {
        deterministic: true,
        ..AttentionBwdParams::default()
    };
    let configs = [
        AttentionBwdParams { d: 64, ..base },
        AttentionBwdParams {
            d: 128,
            causal: true,
            key_cols: 128,
            ..base
        },
        AttentionBwdParams {
            d: 64,
            kv_group: 2,
            window_left: 40,
            window_right: 10,
            softcap: 20.0,
            ..base
        },
        AttentionBwdParams { d: 256, ..base },
        // Two consumer warpgroups of 64 keys each, every column.
        AttentionBwdParams {
            d: 128,
            causal: true,
            block_n: 128,
            block_m: 64,
            num_warps: 8,
            key_cols: 128,
            ..base
        },
        AttentionBwdParams {
            d: 64,
            kv_group: 2,
            block_n: 128,
            block_m: 64,
            num_warps: 8,
            ..base
        },
        // dQ by atomics from the staged dS.
        AttentionBwdParams {
            d: 64,
            causal: true,
            deterministic: false,
            keys_major: true,
            ..base
        },
        AttentionBwdParams {
            d: 128,
            kv_group: 2,
            deterministic: false,
            keys_major: true,
            ..base
        },
        // Two consumer warpgroups of 64 keys: dQ's columns split between them, added in bulk.
        AttentionBwdParams {
            d: 128,
            causal: true,
            deterministic: false,
            keys_major: true,
            block_n: 128,
            block_m: 64,
            num_warps: 8,
            key_cols: 128,
            ..base
        },
        // Queries-major with two consumer warpgroups of 64 query rows: P^T and dS^T staged
        // for dV and dK, dS the register A of dQ, added in bulk.
        AttentionBwdParams {
            d: 64,
            causal: true,
            deterministic: false,
            block_n: 128,
            block_m: 128,
            num_warps: 8,
            ..base
        },
        AttentionBwdParams {
            d: 64,
            kv_group: 2,
            window_left: 70,
            deterministic: false,
            block_n: 128,
            block_m: 128,
            num_warps: 8,
            ..base
        },
    ];
    for p in configs {
        let kernel = scheduled(&attention_bwd_dkdv, p);
        assert!(kernel.schedule.sched.is_some(), "{p:?}: no ring");
        let d = p.d;
        let (b, hk, sq, sk) = (1, 1, 150, 130);
        let h = hk * p.kv_group;
        let inputs = backward_inputs(&mut rng, (b, h, hk), (sq, sk, d));
        let grid = p.key_grid([sk, hk, b]);
        let scale = 0.1f32;
        let run = |scheduled: bool| {
            // Zeroed for the atomics (what `attention_bwd_preprocess` does).
            let mut dq_accum = HostTensor::full(&[b, h, sq, d], DType::F32, 0.0);
            let mut dk = poisoned(&[b, hk, sk, d], DType::Bf16);
            let mut dv = poisoned(&[b, hk, sk, d], DType::Bf16);
            let mut args = input_args(&inputs);
            args.extend([
                HostArg::TensorMut(&mut dq_accum),
                HostArg::TensorMut(&mut dk),
                HostArg::TensorMut(&mut dv),
                HostArg::F32(scale),
            ]);
            if scheduled {
                run_scheduled(&kernel, grid, 2, &mut args).unwrap_or_else(|e| panic!("{p:?}: {e}"));
            } else {
                run_def(&attention_bwd_dkdv, &p, grid, &mut args).expect("interprets");
            }
            (dk, dv, dq_accum)
        };
        let ((dk, dv, dq), (dk_want, dv_want, dq_want)) = (run(true), run(false));
        for (name, got, want) in [
            ("dk", dk, dk_want),
            ("dv", dv, dv_want),
            ("dq", dq, dq_want),
        ] {
            let case = Case {
                kernel: format!("scheduled attention_bwd_dkdv {name} {p:?}"),
                shape: format!("b={b} h={h} sq={sq} sk={sk}"),
                dist: Dist::Normal,
                seed: rng.seed(),
            };
            assert_close(&case, &got, &want.to_f64_vec(), tolerance(DType::Bf16));
        }
    }
}

#[test]
fn a_transposed_stage_is_read_mn_major() {
    // `c = a^T b^T` with both stages read transposed: A MN-major (one or two warpgroups,
    // each its 64 columns of the stage), B K-major; 128-, 64- and 32-byte swizzles.
    let mut rng = Rng::from_env();
    for (bm, bn, bk, nw) in [
        (64, 64, 64, 4),
        (128, 64, 128, 8),
        (64, 128, 32, 4),
        (64, 64, 16, 4),
    ] {
        let ct = WgmmaTransposedComptime {
            BM: bm,
            BN: bn,
            BK: bk,
            NW: nw,
            WS: true,
        };
        let kernel = scheduled(&wgmma_transposed, ct);
        assert_eq!(
            planned_loads(&kernel),
            [(false, Operand::MnMajorA), (false, Operand::KMajorB)],
            "{ct:?}"
        );
        for (m, n, k) in [(70, 130, 150), (3, 5, 7)] {
            let a = tensor(&mut rng, &[k, m], DType::Bf16, Dist::Normal);
            let b = tensor(&mut rng, &[n, k], DType::Bf16, Dist::Normal);
            let want = gemm_tt(&a, &b);
            let grid = [m.div_ceil(bm) as u32, n.div_ceil(bn) as u32, 1];
            let case = Case {
                kernel: format!("wgmma_transposed {ct:?}"),
                shape: format!("m={m} n={n} k={k}"),
                dist: Dist::Normal,
                seed: rng.seed(),
            };
            for run in ["scheduled", "interpreted"] {
                let mut c = poisoned(&[m, n], DType::F32);
                let mut args = [
                    HostArg::Tensor(&a),
                    HostArg::Tensor(&b),
                    HostArg::TensorMut(&mut c),
                ];
                if run == "scheduled" {
                    run_scheduled(&kernel, grid, 2, &mut args)
                        .unwrap_or_else(|e| panic!("{ct:?}: {e}"));
                } else {
                    run_def(&wgmma_transposed, &ct, grid, &mut args).expect("interprets");
                }
                assert_close(&case, &c, &want, tolerance(DType::Bf16));
            }
        }
        assert_assembles(&wgmma_transposed, ct);
        let ptx = kiln_ptx::compile(&build(&wgmma_transposed, ct), Target::Sm90a)
            .expect("compiles")
            .ptx;
        // `imm-trans-a` and `imm-trans-b`, the last two fields: A transposed, B not.
        assert!(
            ptx.lines()
                .filter(|l| l.contains("wgmma.mma_async"))
                .all(|l| l.trim_end().ends_with("1, 0;")),
            "{ct:?}"
        );
    }
}
