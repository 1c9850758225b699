//! General mma lowering on the CPU: the kernels of `mma_kernels/` (an mma outside any loop,
//! two mma loops with transposed register operands, a register B computed in the kernel, a
//! masked operand, a persistent loop with a runtime stride, an mma in a runtime `if`) run on
//! the interpreter against f64 references (shapes no multiple of the tiles, every input
//! distribution, outputs poisoned), and compile for sm_80 and sm_90a to PTX that ptxas
//! assembles without spills. Their GPU runs are in `gpu_mma_general.rs`.

mod mma_kernels;

use kiln_ir::dsl::{KernelDecl, KernelDef, Spec};
use kiln_ir::interp::{HostArg, run_def, run_scheduled};
use kiln_ir::{DType, HostTensor, Kernel, Target};
use kiln_tests::check::{Case, assert_close, poisoned, tolerance};
use kiln_tests::inputs::{Dist, Rng, tensor};
use kiln_tests::sweep::sweep;
use mma_kernels::*;

/// `(m, n, k)`: none a multiple of the 64 x 64 x 32 tiles, several blocks in each dimension.
const SHAPES: [(usize, usize, usize); 3] = [(70, 130, 50), (129, 65, 100), (1, 3, 17)];

fn case(kernel: &str, shape: String, dist: Dist, rng: &Rng) -> Case {
    Case {
        kernel: kernel.into(),
        shape,
        dist,
        seed: rng.seed(),
    }
}

/// Runs a kernel of signature `(a, b, c, ..)` on `(m, n, k)` operands and checks `c` against
/// `want(a, b)`.
fn check_gemm_like<D: KernelDef>(
    def: &D,
    ct: &D::Comptime,
    grid: impl Fn(usize, usize) -> [u32; 3],
    want: impl Fn(&HostTensor, &HostTensor) -> Vec<f64>,
    shapes: &[(usize, usize, usize)],
    extra: &[HostArg<'static>],
) {
    let mut rng = Rng::from_env();
    let kernel = format!("{} {extra:?}", def.name());
    let label = |(m, n, k)| format!("m={m} n={n} k={k}");
    sweep(
        &mut rng,
        &kernel,
        shapes.iter().copied(),
        &Dist::ALL,
        label,
        |rng, (m, n, k), case| {
            let a = tensor(rng, &[m, k], DType::Bf16, case.dist);
            let b = tensor(rng, &[k, n], DType::Bf16, case.dist);
            let mut c = poisoned(&[m, n], DType::F32);
            let mut args = vec![
                HostArg::Tensor(&a),
                HostArg::Tensor(&b),
                HostArg::TensorMut(&mut c),
            ];
            for x in extra {
                args.push(match x {
                    HostArg::I32(v) => HostArg::I32(*v),
                    HostArg::F32(v) => HostArg::F32(*v),
                    _ => unreachable!("only scalars are extra"),
                });
            }
            run_def(def, ct, grid(m, n), &mut args).unwrap();
            assert_close(case, &c, &want(&a, &b), tolerance(DType::Bf16));
        },
    );
}

fn tiles(m: usize, n: usize) -> [u32; 3] {
    [m.div_ceil(64) as u32, n.div_ceil(64) as u32, 1]
}

#[test]
fn mma_once_matches_reference() {
    // K at most one BK tile (32).
    let shapes = [(70, 130, 32), (129, 65, 17), (1, 3, 1)];
    let ct = MmaOnceComptime::default();
    check_gemm_like(&mma_once, &ct, tiles, gemm, &shapes, &[]);
}

#[test]
fn mma_register_b_matches_reference() {
    let ct = MmaRegisterBComptime::default();
    check_gemm_like(&mma_register_b, &ct, tiles, gemm_exp_b, &SHAPES, &[]);
    // On sm_90a a ring whose consumers stage B each iteration (its one buffer: no group
    // stays in flight into the next iteration), executed on the CPU as scheduled.
    let mut k = mma_register_b
        .build(&Spec::uniform(ct, mma_register_b.signature(), true))
        .expect("builds");
    kiln_ir::passes::run_pipeline(&mut k, Target::Sm90a, &mut |_, _| {}).expect("lowers");
    let s = k.schedule.sched.as_ref().expect("a ring");
    assert!(!kiln_ir::passes::pipeline::overlaps(&k, s.for_op));
    let staged: Vec<_> = k
        .schedule
        .staged
        .iter()
        .map(|s| (s.slot, s.transposed))
        .collect();
    assert_eq!(staged, [(1, false)]);
    let mut rng = Rng::from_env();
    for (m, n, kk) in [(70, 130, 150), (3, 5, 7)] {
        let a = tensor(&mut rng, &[m, kk], DType::Bf16, Dist::Normal);
        let b = tensor(&mut rng, &[kk, n], DType::Bf16, Dist::Normal);
        let mut c = poisoned(&[m, n], DType::F32);
        let mut args = [
            HostArg::Tensor(&a),
            HostArg::Tensor(&b),
            HostArg::TensorMut(&mut c),
        ];
        run_scheduled(&k, tiles(m, n), 2, &mut args).expect("runs as scheduled");
        let case = Case {
            kernel: "mma_register_b as scheduled on sm_90a".into(),
            shape: format!("m={m} n={n} k={kk}"),
            dist: Dist::Normal,
            seed: rng.seed(),
        };
        assert_close(&case, &c, &gemm_exp_b(&a, &b), tolerance(DType::Bf16));
    }
}

/// An accumulator of 64 rows over 8 warps (two warps a row) whose rows are summed: the sums
/// cross warps.
#[test]
fn mma_row_centered_matches_reference() {
    let ct = MmaRowCenteredComptime::default();
    let grid = |m: usize, n: usize| [m.div_ceil(ct.BM) as u32, n.div_ceil(ct.BN) as u32, 1];
    let want = |a: &HostTensor, b: &HostTensor| gemm_row_centered(a, b, ct.BN);
    let shapes = [(70, 200, 50), (129, 65, 100), (1, 3, 17)];
    check_gemm_like(&mma_row_centered, &ct, grid, want, &shapes, &[]);
    // sm_80 spreads the 64 rows over 4 x 2 warps: each row's sum combines two warps'
    // through shared memory.
    let k = mma_row_centered
        .build(&Spec::uniform(ct, mma_row_centered.signature(), true))
        .expect("builds");
    let m = kiln_ptx::compile(&k, Target::Sm80).expect("compiles");
    assert!(
        m.ptx
            .contains("reduction across warps through shared memory"),
        "no reduction across warps"
    );
}

/// `(BM, NW)`: the warp counts `mma_masked` is run with (comptime `num_warps`).
const WARPS: [(usize, usize); 3] = [(64, 4), (64, 2), (128, 8)];

#[test]
fn mma_masked_matches_reference() {
    for (bm, nw) in WARPS {
        let ct = MmaMaskedComptime {
            BM: bm,
            NW: nw,
            ..MmaMaskedComptime::default()
        };
        let grid = |m: usize, n: usize| [m.div_ceil(bm) as u32, n.div_ceil(64) as u32, 1];
        check_gemm_like(&mma_masked, &ct, grid, gemm_tril_a, &SHAPES, &[]);
    }
}

/// `#[kernel(num_warps = NW)]`: the comptime value is the kernel's warp count and the PTX's
/// block size, for every value tried; one outside 1..=32 is a diagnostic at the attribute.
#[test]
fn num_warps_is_a_comptime_value() {
    for (bm, nw) in WARPS {
        let ct = MmaMaskedComptime {
            BM: bm,
            NW: nw,
            ..MmaMaskedComptime::default()
        };
        let k = mma_masked
            .build(&Spec::uniform(ct, mma_masked.signature(), true))
            .expect("builds");
        assert_eq!(k.options.num_warps, nw as u32);
        let m = kiln_ptx::compile(&k, Target::Sm80).expect("compiles");
        assert_eq!(m.threads_per_block, 32 * nw as u32, "NW={nw}");
        if kiln_ptx::ptxas::find_ptxas().is_ok() {
            let r = kiln_ptx::ptxas::check(&m.ptx, Target::Sm80).expect("assembles");
            assert!(!r.spills(), "NW={nw} spills: {r}");
        }
    }
    for nw in [0, 33] {
        let ct = MmaMaskedComptime {
            NW: nw,
            ..MmaMaskedComptime::default()
        };
        let e = mma_masked.build(&Spec::new(ct)).expect_err("out of range");
        let text = e.to_string();
        assert!(
            text.contains(&format!("`num_warps` is {nw}")) && text.contains("mma_kernels/mod.rs"),
            "{text}"
        );
    }
}

/// Poisons (NaN) the elements of `t` (`[rows, cols]`) that `keep(row, col)` rejects: what a
/// masked load must never read.
fn poison_outside(t: &mut HostTensor, keep: impl Fn(usize, usize) -> bool) {
    let cols = t.shape[1];
    for i in 0..t.data.len() {
        if !keep(i / cols, i % cols) {
            t.data.set_f64(i, f64::NAN);
        }
    }
}

/// `mma_bounded` (A and B masked at `klim` along K) and `mma_masked_b` (B masked in two
/// dimensions) with the elements past their bounds NaN: bounds inside a tile, at the tensor's
/// edge, past it and at 0.
#[test]
fn masked_operands_match_reference() {
    let mut rng = Rng::from_env();
    for &(m, n, k) in &SHAPES {
        for dist in Dist::ALL {
            for klim in [k * 3 / 4 + 1, k, k + 9, 0] {
                let nlim = n * 2 / 3 + 1;
                // A for each kernel: `mma_masked_b` reads all of it.
                let a_all = tensor(&mut rng, &[m, k], DType::Bf16, dist);
                let mut a = a_all.clone();
                poison_outside(&mut a, |_, p| p < klim);
                // B for each kernel, NaN past what it reads.
                let mut b_k = tensor(&mut rng, &[k, n], DType::Bf16, dist);
                let mut b_kn = b_k.clone();
                poison_outside(&mut b_k, |p, _| p < klim);
                poison_outside(&mut b_kn, |p, j| p < klim && j < nlim);
                let shape = format!("m={m} n={n} k={k} klim={klim} nlim={nlim}");
                let tol = tolerance(DType::Bf16);
                let mut c = poisoned(&[m, n], DType::F32);
                let mut args = [
                    HostArg::Tensor(&a),
                    HostArg::Tensor(&b_k),
                    HostArg::TensorMut(&mut c),
                    HostArg::I32(klim as i32),
                ];
                run_def(
                    &mma_bounded,
                    &MmaBoundedComptime::default(),
                    tiles(m, n),
                    &mut args,
                )
                .unwrap();
                let want = gemm_bounded(&a, &b_k, klim, n);
                assert_close(
                    &case("mma_bounded", shape.clone(), dist, &rng),
                    &c,
                    &want,
                    tol,
                );
                let mut c = poisoned(&[m, n], DType::F32);
                let mut args = [
                    HostArg::Tensor(&a_all),
                    HostArg::Tensor(&b_kn),
                    HostArg::TensorMut(&mut c),
                    HostArg::I32(klim as i32),
                    HostArg::I32(nlim as i32),
                ];
                run_def(
                    &mma_masked_b,
                    &MmaMaskedBComptime::default(),
                    tiles(m, n),
                    &mut args,
                )
                .unwrap();
                let want = gemm_bounded(&a_all, &b_kn, klim, nlim);
                assert_close(&case("mma_masked_b", shape, dist, &rng), &c, &want, tol);
            }
        }
    }
}

#[test]
fn mma_gathered_b_matches_reference() {
    let ct = MmaGatheredBComptime::default();
    check_gemm_like(&mma_gathered_b, &ct, tiles, gemm_gathered_b, &SHAPES, &[]);
}

#[test]
fn mma_persistent_matches_reference() {
    let ct = MmaPersistentComptime::default();
    // Fewer blocks than tiles (several tiles per block, some blocks one more) and more.
    for blocks in [3u32, 7, 64] {
        check_gemm_like(
            &mma_persistent,
            &ct,
            |_, _| [blocks, 1, 1],
            gemm,
            &SHAPES,
            &[],
        );
    }
}

#[test]
fn mma_in_if_matches_reference() {
    let ct = MmaInIfComptime::default();
    check_gemm_like(&mma_in_if, &ct, tiles, gemm, &SHAPES, &[HostArg::I32(1)]);
    let negated = |a: &HostTensor, b: &HostTensor| gemm(a, b).iter().map(|x| -x).collect();
    check_gemm_like(&mma_in_if, &ct, tiles, negated, &SHAPES, &[HostArg::I32(0)]);
}

#[test]
fn mma_two_loops_matches_reference() {
    let mut rng = Rng::from_env();
    let ct = MmaTwoLoopsComptime::default();
    for (sq, sk) in [(100, 70), (64, 129), (3, 5)] {
        for dist in Dist::ALL {
            let d = ct.D;
            let q = tensor(&mut rng, &[sq, d], DType::Bf16, dist);
            let k = tensor(&mut rng, &[sk, d], DType::Bf16, dist);
            let scale = 1.0 / (d as f32).sqrt();
            let mut dv = poisoned(&[sk, d], DType::F32);
            let mut dk = poisoned(&[sk, d], DType::F32);
            let mut args = [
                HostArg::Tensor(&q),
                HostArg::Tensor(&k),
                HostArg::TensorMut(&mut dv),
                HostArg::TensorMut(&mut dk),
                HostArg::F32(scale),
            ];
            run_def(
                &mma_two_loops,
                &ct,
                [sk.div_ceil(ct.BN) as u32, 1, 1],
                &mut args,
            )
            .unwrap();
            let (want_v, want_k) = two_loops(&q, &k, f64::from(scale));
            let shape = format!("sq={sq} sk={sk} d={d}");
            let tol = tolerance(DType::Bf16);
            assert_close(
                &case("mma_two_loops dv", shape.clone(), dist, &rng),
                &dv,
                &want_v,
                tol,
            );
            assert_close(
                &case("mma_two_loops dk", shape, dist, &rng),
                &dk,
                &want_k,
                tol,
            );
        }
    }
}

/// Every kernel of `mma_general/`, built with its defaults, tensors aligned or not.
fn kernels(aligned: bool) -> Vec<Kernel> {
    fn b<D: KernelDef>(def: &D, aligned: bool) -> Kernel
    where
        D::Comptime: Default,
    {
        let spec = Spec::uniform(D::Comptime::default(), def.signature(), aligned);
        def.build(&spec)
            .unwrap_or_else(|e| panic!("{} does not build: {e}", def.name()))
    }
    vec![
        b(&mma_once, aligned),
        b(&mma_register_b, aligned),
        b(&mma_masked, aligned),
        b(&mma_persistent, aligned),
        b(&mma_in_if, aligned),
        b(&mma_two_loops, aligned),
        b(&mma_bounded, aligned),
        b(&mma_masked_b, aligned),
        b(&mma_gathered_b, aligned),
        b(&mma_row_centered, aligned),
    ]
}

fn assemble(target: Target) {
    if let Err(e) = kiln_ptx::ptxas::find_ptxas() {
        println!("skipped: {e}");
        return;
    }
    let mut failures = Vec::new();
    for aligned in [true, false] {
        for k in kernels(aligned) {
            let name = format!("{} (aligned16={aligned}) on {target}", k.name);
            let m = match kiln_ptx::compile(&k, target) {
                Ok(m) => m,
                Err(e) => {
                    failures.push(format!("{name}: {e}"));
                    continue;
                }
            };
            match kiln_ptx::ptxas::check(&m.ptx, target) {
                Ok(r) if r.spills() => failures.push(format!("{name} spills: {r}")),
                Ok(_) => {}
                Err(e) => failures.push(format!("{name}: ptxas: {e}")),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Exactly the register operands mma.sync cannot read in place are staged through shared
/// memory: a register B, a masked A, the transposes `p.t()` and `s.t()` (stored as they
/// are, read transposed); loads, their transposes, and the examples' operands (attention's
/// P, an accumulator-layout A) are not.
#[test]
fn staging_covers_exactly_the_register_operands() {
    let expect = [
        ("mma_once", vec![]),
        ("mma_register_b", vec![false]),
        ("mma_masked", vec![false]),
        ("mma_persistent", vec![]),
        ("mma_in_if", vec![]),
        ("mma_two_loops", vec![true, true]),
        ("mma_bounded", vec![]),
        ("mma_masked_b", vec![false]),
        ("mma_gathered_b", vec![false]),
        ("mma_row_centered", vec![]),
    ];
    for target in [Target::Sm80, Target::Sm90a] {
        for mut k in kernels(true) {
            kiln_ir::passes::run_pipeline(&mut k, target, &mut |_, _| {}).expect("lowers");
            let (_, want) = expect.iter().find(|(n, _)| *n == k.name).expect("listed");
            let got: Vec<bool> = k.schedule.staged.iter().map(|s| s.transposed).collect();
            assert_eq!(&got, want, "{} on {target}", k.name);
            for st in &k.schedule.staged {
                let b = &st.buffer;
                assert!(
                    b.offset.is_multiple_of(128)
                        && b.offset + b.stage_bytes <= k.schedule.smem_bytes
                );
            }
        }
        for example in ["gemm", "attention"] {
            let mut k = kiln_examples::build(example, &[], true).expect("builds");
            kiln_ir::passes::run_pipeline(&mut k, target, &mut |_, _| {}).expect("lowers");
            assert!(k.schedule.staged.is_empty(), "{example} on {target}");
            assert!(k.schedule.notes.is_empty(), "{example} on {target}");
        }
    }
}

/// A masked load bounded along one dimension is copied into shared memory (a buffer, staged
/// `n - 1` iterations ahead in its pipelined loop), as a plain load is: `mma_bounded`'s A
/// and B both, on both targets.
#[test]
fn bounded_masked_loads_are_copied_ahead_into_shared_memory() {
    for target in [Target::Sm80, Target::Sm90a] {
        for aligned in [true, false] {
            let spec = Spec::uniform(
                MmaBoundedComptime::default(),
                mma_bounded.signature(),
                aligned,
            );
            let mut k = mma_bounded.build(&spec).expect("builds");
            kiln_ir::passes::run_pipeline(&mut k, target, &mut |_, _| {}).expect("lowers");
            let what = format!("{target} aligned {aligned}");
            let buffers = &k.schedule.buffers;
            assert_eq!(buffers.len(), 2, "{what}");
            let plan = k.schedule.loops.values().next().expect("a pipelined loop");
            for b in buffers {
                let masked = matches!(k.ops[b.load].kind, kiln_ir::OpKind::Gather { .. });
                assert!(masked && b.stages == 3, "{what}");
                assert!(plan.prefetched.contains(&b.load), "{what}");
            }
            assert!(k.schedule.staged.is_empty());
        }
    }
}

/// On sm_90a no kernel but `mma_row_centered` and `mma_register_b` gets the warp-specialised
/// schedule: each carries a note at its first mma saying why, and runs its mmas on wgmma
/// without warp roles (`wgmma_general.rs`).
#[test]
fn sm90a_notes_say_why_each_kernel_is_lowered_plainly() {
    let why = [
        ("mma_once", "outside any loop"),
        ("mma_masked", "operands or shapes"),
        ("mma_persistent", "not `pipelined`"),
        ("mma_in_if", "not `pipelined`"),
        ("mma_two_loops", "2 loops with mmas"),
        ("mma_bounded", "operands or shapes"),
        ("mma_masked_b", "operands or shapes"),
        ("mma_gathered_b", "operands or shapes"),
    ];
    for mut k in kernels(true) {
        kiln_ir::passes::run_pipeline(&mut k, Target::Sm90a, &mut |_, _| {}).expect("lowers");
        if k.name == "mma_row_centered" || k.name == "mma_register_b" {
            // Its 64 rows over two consumer warpgroups, a column block each (`WgmmaColumns`),
            // or its B computed in registers, which the consumers stage: the ring's.
            assert!(k.schedule.sched.is_some(), "{}", k.name);
            assert!(k.schedule.notes.is_empty(), "{}", k.name);
            continue;
        }
        let (_, reason) = why.iter().find(|(n, _)| *n == k.name).expect("listed");
        let [note] = &k.schedule.notes[..] else {
            panic!("{}: one note, got {:?}", k.name, k.schedule.notes);
        };
        assert!(
            note.text
                .starts_with("sm_90a: lowered with cp.async and wgmma")
                && note.text.contains(reason)
                && note.loc.to_string().contains("mma_kernels/mod.rs"),
            "{}: {note:?}",
            k.name
        );
        assert!(k.schedule.sched.is_none(), "{}", k.name);
        assert!(!k.schedule.wgmma.is_empty(), "{}", k.name);
    }
    // A kernel that cannot get a ring keeps the warps it declares (a 128-row mma would be
    // two consumer warpgroups' in one).
    let ct = MmaOnceComptime {
        BM: 128,
        ..MmaOnceComptime::default()
    };
    let mut k = mma_once
        .build(&Spec::uniform(ct, mma_once.signature(), true))
        .expect("builds");
    kiln_ir::passes::run_pipeline(&mut k, Target::Sm90a, &mut |_, _| {}).expect("lowers");
    assert_eq!(k.options.num_warps, 4);
    // No note on sm_80, where mma.sync is the only lowering.
    for mut k in kernels(true) {
        kiln_ir::passes::run_pipeline(&mut k, Target::Sm80, &mut |_, _| {}).expect("lowers");
        assert!(k.schedule.notes.is_empty(), "{}", k.name);
    }
}

/// Larger tiles than the defaults (128-row and 128-wide operands, a head dim of 128) still
/// assemble without spills on both targets.
#[test]
fn larger_tiles_assemble_without_spills() {
    if kiln_ptx::ptxas::find_ptxas().is_err() {
        return;
    }
    let two_loops = MmaTwoLoopsComptime {
        D: 128,
        ..MmaTwoLoopsComptime::default()
    };
    let register_b = MmaRegisterBComptime {
        BM: 128,
        BN: 128,
        BK: 32,
    };
    let masked = MmaMaskedComptime {
        BM: 128,
        BN: 128,
        BK: 64,
        NW: 8,
    };
    let kernels = [
        mma_two_loops
            .build(&Spec::uniform(two_loops, mma_two_loops.signature(), true))
            .expect("builds"),
        mma_register_b
            .build(&Spec::uniform(register_b, mma_register_b.signature(), true))
            .expect("builds"),
        mma_masked
            .build(&Spec::uniform(masked, mma_masked.signature(), true))
            .expect("builds"),
    ];
    for k in &kernels {
        for target in [Target::Sm80, Target::Sm90a] {
            let m = kiln_ptx::compile(k, target).expect("compiles");
            let r = kiln_ptx::ptxas::check(&m.ptx, target).expect("assembles");
            assert!(!r.spills(), "{} on {target} spills: {r}", k.name);
        }
    }
}

#[test]
fn every_kernel_assembles_for_sm80_without_spills() {
    assemble(Target::Sm80);
}

#[test]
fn every_kernel_assembles_for_sm90a_without_spills() {
    assemble(Target::Sm90a);
}
