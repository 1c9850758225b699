//! sm_90a's wgmma outside a warp-specialised ring, checked on the CPU: the kernels of
//! `wgmma_kernels/` (transposed operands in one and two warpgroups, a chained mma with a register
//! A, an A gathered once before a loop of mmas and written once to shared memory) against f64
//! references on the interpreter; which mmas the plan takes (those kernels', `mma_kernels/`' and
//! attention's backward's) and the note at each it does not; the PTX's structure (no mma.sync,
//! wgmma groups fenced, committed and waited for before the accumulator is touched, shared
//! stores fenced into the async proxy), through both ptxas with no spill; sm_80 unchanged; one
//! PTX snapshot. The GPU runs: `gpu_wgmma_general.rs`.

mod mma_kernels;
mod wgmma_kernels;

use kiln_ir::dsl::{KernelDef, Spec};
use kiln_ir::interp::{HostArg, run_def};
use kiln_ir::passes::run_pipeline;
use kiln_ir::{DType, HostTensor, Kernel, OpKind, Target};
use kiln_ptx::ptxas::{self, Tool};
use kiln_tests::check::{Case, assert_close, poisoned, tolerance};
use kiln_tests::inputs::{Dist, Rng, tensor};
use wgmma_kernels::*;

fn build<D: KernelDef>(def: &D, ct: D::Comptime) -> Kernel {
    def.build(&Spec::uniform(ct, def.signature(), true))
        .unwrap_or_else(|e| panic!("{} does not build: {e}", def.name()))
}

/// `wgmma_transposed` in its one- and two-warpgroup forms, the second with 256-byte rows of
/// A's tile (column boxes) and a K of 128 (B's rows boxed too); B's rows of 64 and 32 bytes
/// (the 64- and 32-byte swizzles).
fn transposed_configs() -> [WgmmaTransposedComptime; 4] {
    [
        WgmmaTransposedComptime::default(),
        WgmmaTransposedComptime {
            BM: 128,
            BN: 64,
            BK: 128,
            NW: 8,
            ..Default::default()
        },
        WgmmaTransposedComptime {
            BM: 64,
            BN: 128,
            BK: 32,
            NW: 4,
            ..Default::default()
        },
        // B's rows of 32 bytes: the 32-byte swizzle.
        WgmmaTransposedComptime {
            BM: 64,
            BN: 64,
            BK: 16,
            NW: 4,
            ..Default::default()
        },
    ]
}

#[test]
fn wgmma_transposed_matches_reference() {
    let mut rng = Rng::from_env();
    for ct in transposed_configs() {
        // (m, n, k): none a multiple of the tiles, several blocks each way.
        for (m, n, k) in [(70, 130, 150), (129, 65, 33), (3, 5, 7)] {
            for dist in Dist::ALL {
                let a = tensor(&mut rng, &[k, m], DType::Bf16, dist);
                let b = tensor(&mut rng, &[n, k], DType::Bf16, dist);
                let mut c = poisoned(&[m, n], DType::F32);
                let grid = [m.div_ceil(ct.BM) as u32, n.div_ceil(ct.BN) as u32, 1];
                let mut args = [
                    HostArg::Tensor(&a),
                    HostArg::Tensor(&b),
                    HostArg::TensorMut(&mut c),
                ];
                run_def(&wgmma_transposed, &ct, grid, &mut args).unwrap();
                let case = Case {
                    kernel: format!("wgmma_transposed BM={} BK={}", ct.BM, ct.BK),
                    shape: format!("m={m} n={n} k={k}"),
                    dist,
                    seed: rng.seed(),
                };
                assert_close(&case, &c, &gemm_tt(&a, &b), tolerance(DType::Bf16));
            }
        }
    }
}

#[test]
fn wgmma_chain_matches_reference() {
    let mut rng = Rng::from_env();
    for d in [64, 96, 128] {
        let ct = WgmmaChainComptime {
            D: d,
            ..WgmmaChainComptime::default()
        };
        for (sq, sk) in [(100, 70), (64, 129), (3, 5)] {
            for dist in Dist::ALL {
                let q = tensor(&mut rng, &[sq, d], DType::Bf16, dist);
                let k = tensor(&mut rng, &[sk, d], DType::Bf16, dist);
                let v = tensor(&mut rng, &[sk, d], DType::Bf16, dist);
                let scale = 1.0 / (d as f32).sqrt();
                let mut o = poisoned(&[sq, d], DType::F32);
                let mut args = [
                    HostArg::Tensor(&q),
                    HostArg::Tensor(&k),
                    HostArg::Tensor(&v),
                    HostArg::TensorMut(&mut o),
                    HostArg::F32(scale),
                ];
                run_def(
                    &wgmma_chain,
                    &ct,
                    [sq.div_ceil(ct.BM) as u32, 1, 1],
                    &mut args,
                )
                .unwrap();
                let case = Case {
                    kernel: format!("wgmma_chain d={d}"),
                    shape: format!("sq={sq} sk={sk}"),
                    dist,
                    seed: rng.seed(),
                };
                let want = chain(&q, &k, &v, f64::from(scale));
                assert_close(&case, &o, &want, tolerance(DType::Bf16));
            }
        }
    }
}

/// `wgmma_held_a` in one and two warpgroups, rows of 128 and 256 bytes (the second boxed),
/// 64 and 128 columns of B.
fn held_a_configs() -> [WgmmaHeldAComptime; 3] {
    [
        WgmmaHeldAComptime::default(),
        WgmmaHeldAComptime {
            BM: 128,
            BN: 64,
            D: 128,
            NW: 8,
        },
        WgmmaHeldAComptime {
            BM: 64,
            BN: 128,
            D: 128,
            NW: 4,
        },
    ]
}

/// The inputs of `wgmma_held_a` for `m` rows gathered from `r`, `j` blocks of B, `n`
/// columns: `(a, rows as a tensor, rows, b)`.
fn held_a_inputs(
    rng: &mut Rng,
    (m, r, j, n): (usize, usize, usize, usize),
    d: usize,
    dist: Dist,
) -> (HostTensor, HostTensor, Vec<i32>, HostTensor) {
    let a = tensor(rng, &[r, d], DType::Bf16, dist);
    let rows = held_rows(rng, m, r);
    let rows_t = HostTensor::from_fn(&[m], DType::I32, |i| f64::from(rows[i]));
    let b = tensor(rng, &[j * d, n], DType::Bf16, dist);
    (a, rows_t, rows, b)
}

/// Shapes of `wgmma_held_a`: `(m, r, j, n)`, none a multiple of the tiles.
const HELD_A_SHAPES: [(usize, usize, usize, usize); 3] =
    [(100, 37, 3, 70), (3, 5, 1, 9), (130, 200, 2, 129)];

#[test]
fn wgmma_held_a_matches_reference() {
    let mut rng = Rng::from_env();
    for ct in held_a_configs() {
        for shape in HELD_A_SHAPES {
            for dist in Dist::ALL {
                let (a, rows_t, rows, b) = held_a_inputs(&mut rng, shape, ct.D, dist);
                let (m, n) = (shape.0, shape.3);
                let mut c = poisoned(&[m, n], DType::F32);
                let mut args = [
                    HostArg::Tensor(&a),
                    HostArg::Tensor(&rows_t),
                    HostArg::Tensor(&b),
                    HostArg::TensorMut(&mut c),
                ];
                let grid = [m.div_ceil(ct.BM) as u32, n.div_ceil(ct.BN) as u32, 1];
                run_def(&wgmma_held_a, &ct, grid, &mut args).unwrap();
                let case = Case {
                    kernel: format!("wgmma_held_a {ct:?}"),
                    shape: format!("{shape:?}"),
                    dist,
                    seed: rng.seed(),
                };
                assert_close(&case, &c, &held_a(&a, &rows, &b), tolerance(DType::Bf16));
            }
        }
    }
}

/// An A gathered into registers before the loop of its wgmmas is written into shared memory
/// once, where it is loaded: the plan stages it at its source (swizzled, on the 1024-byte
/// atom, boxed for 256-byte rows), and in the PTX every shared store precedes the loop, the
/// writes are fenced into the async proxy and published by a barrier before the loop, and
/// every wgmma reads A through a descriptor (no register A). sm_80 keeps it in registers.
#[test]
fn an_a_loaded_before_its_loop_is_staged_once_where_it_is_loaded() {
    for ct in held_a_configs() {
        let k = build(&wgmma_held_a, ct);
        let mut on90 = k.clone();
        run_pipeline(&mut on90, Target::Sm90a, &mut |_, _| {}).expect("lowers");
        let staged: Vec<_> = on90.schedule.staged.iter().collect();
        assert_eq!(staged.len(), 1, "{ct:?}: {staged:?}");
        let st = staged[0];
        assert!(st.at_source && !st.transposed, "{ct:?}: {st:?}");
        assert!(on90.schedule.staged(st.operand).is_none());
        let buf = &st.buffer;
        assert_eq!(buf.row_bytes, 2 * ct.D as u32);
        assert_eq!(buf.stage_bytes, buf.row_bytes * ct.BM as u32);
        assert!(buf.swizzled && buf.offset.is_multiple_of(1024), "{buf:?}");
        assert_eq!(buf.boxed, ct.D == 128, "{buf:?}");
        let printed = kiln_ir::print::print_kernel(&on90);
        assert!(printed.contains("once where loaded"), "{printed}");
        let m = kiln_ptx::compile(&k, Target::Sm90a).expect("compiles");
        let lines: Vec<&str> = m
            .ptx
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with("//"))
            .collect();
        let loop_head = lines
            .iter()
            .position(|l| l.starts_with("$L") && l.ends_with(':'))
            .or_else(|| lines.iter().position(|l| l.starts_with("$L")))
            .expect("a loop");
        let stores: Vec<usize> = (0..lines.len())
            .filter(|&i| lines[i].starts_with("st.shared") || lines[i].starts_with("stmatrix"))
            .collect();
        assert!(
            !stores.is_empty(),
            "{ct:?}: A is not written to shared memory"
        );
        assert!(
            stores.iter().all(|&i| i < loop_head),
            "{ct:?}: a shared store in the loop"
        );
        let last = *stores.last().expect("stores");
        let fence = (last..loop_head)
            .find(|&i| lines[i] == "fence.proxy.async.shared::cta;")
            .expect("the staged A is not fenced into the async proxy");
        assert!(
            (fence..loop_head).any(|i| lines[i] == "bar.sync 0;"),
            "{ct:?}: the staged A is not published before the loop"
        );
        let wgmmas: Vec<&&str> = lines
            .iter()
            .filter(|l| l.starts_with("wgmma.mma_async"))
            .collect();
        assert_eq!(wgmmas.len(), ct.D / 16, "{ct:?}: one wgmma per k16 step");
        for w in wgmmas {
            assert_eq!(w.matches('{').count(), 1, "{ct:?}: a register A in `{w}`");
        }
        check_structure(&k.name, &m.ptx);
        let mut on80 = k.clone();
        run_pipeline(&mut on80, Target::Sm80, &mut |_, _| {}).expect("lowers");
        assert!(on80.schedule.staged.is_empty() && on80.schedule.wgmma.is_empty());
    }
}

/// Every kernel whose mmas sm_90a should all run as wgmma without warp roles.
fn all_wgmma_kernels() -> Vec<Kernel> {
    use mma_kernels::*;
    let mut out: Vec<Kernel> = transposed_configs()
        .into_iter()
        .map(|ct| build(&wgmma_transposed, ct))
        .collect();
    for d in [64, 96, 128] {
        let ct = WgmmaChainComptime {
            D: d,
            ..WgmmaChainComptime::default()
        };
        out.push(build(&wgmma_chain, ct));
    }
    for ct in held_a_configs() {
        out.push(build(&wgmma_held_a, ct));
    }
    out.push(build(&mma_once, MmaOnceComptime::default()));
    out.push(build(&mma_masked, MmaMaskedComptime::default()));
    out.push(build(&mma_persistent, MmaPersistentComptime::default()));
    out.push(build(&mma_in_if, MmaInIfComptime::default()));
    out.push(build(&mma_two_loops, MmaTwoLoopsComptime::default()));
    out.push(build(
        &mma_two_loops,
        MmaTwoLoopsComptime {
            D: 128,
            ..MmaTwoLoopsComptime::default()
        },
    ));
    // The deterministic dQ walk takes a warp-specialised ring (`ring_held_b.rs`).
    for name in ["attention_bwd_dkdv"] {
        for d in ["64", "128"] {
            for dtype in ["bf16", "f16"] {
                let k = kiln_examples::build(name, &[("d", d), ("dtype", dtype)], true)
                    .unwrap_or_else(|e| panic!("{name} d={d} {dtype}: {e}"));
                out.push(k);
            }
        }
    }
    out
}

/// Every mma of `k`, nested ones included.
fn mmas(k: &Kernel) -> Vec<kiln_ir::OpId> {
    fn walk(k: &Kernel, ops: &[kiln_ir::OpId], out: &mut Vec<kiln_ir::OpId>) {
        for &o in ops {
            if k.ops[o].kind == OpKind::Mma {
                out.push(o);
            }
            for r in &k.ops[o].regions {
                walk(k, &r.ops, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(k, &k.body.ops, &mut out);
    out
}

/// The plan takes every mma of these kernels on sm_90a and none on sm_80, where no buffer is
/// boxed and no note is added.
#[test]
fn the_plan_takes_every_mma_on_sm90a_only() {
    for k in all_wgmma_kernels() {
        let mut on90 = k.clone();
        run_pipeline(&mut on90, Target::Sm90a, &mut |_, _| {}).expect("lowers");
        let all: std::collections::BTreeSet<_> = mmas(&on90).into_iter().collect();
        assert!(!all.is_empty(), "{}", k.name);
        assert_eq!(
            on90.schedule.wgmma, all,
            "{}: {:?}",
            k.name, on90.schedule.notes
        );
        assert!(on90.schedule.sched.is_none(), "{}", k.name);
        // Every buffer wgmma reads starts on the 128-byte swizzle's 1024-byte atom.
        for b in on90
            .schedule
            .buffers
            .iter()
            .chain(on90.schedule.staged.iter().map(|s| &s.buffer))
        {
            assert!(b.offset.is_multiple_of(1024), "{}: {b:?}", k.name);
            assert!(b.offset + b.stage_bytes * b.stages <= on90.schedule.smem_bytes);
        }
        let mut on80 = k.clone();
        run_pipeline(&mut on80, Target::Sm80, &mut |_, _| {}).expect("lowers");
        assert!(on80.schedule.wgmma.is_empty(), "{}", k.name);
        assert!(on80.schedule.buffers.iter().all(|b| !b.boxed));
        assert!(on80.schedule.notes.is_empty(), "{}", k.name);
    }
}

/// Operands with rows wider than the 128-byte swizzle are boxed: `wgmma_transposed` with
/// 128-column tiles of `a` (256-byte rows, read in place as the transposed A) and a K of 128
/// (B's loaded rows); nothing is staged from registers.
#[test]
fn wide_rows_are_stored_in_column_boxes() {
    let mut k = build(&wgmma_transposed, transposed_configs()[1]);
    run_pipeline(&mut k, Target::Sm90a, &mut |_, _| {}).expect("lowers");
    let rows = |bufs: Vec<&kiln_ir::schedule::SmemBuffer>| -> Vec<(u32, bool)> {
        bufs.iter().map(|b| (b.row_bytes, b.boxed)).collect()
    };
    assert_eq!(
        rows(k.schedule.buffers.iter().collect()),
        [(256, true), (256, true)]
    );
    assert!(k.schedule.staged.is_empty());
}

/// Where the plan cannot take an mma, it stays on mma.sync with a note at its line saying why
/// (in the DSL's words), and the kernel still compiles and assembles.
#[test]
fn an_mma_the_plan_cannot_take_is_noted_at_its_line() {
    // The gemm example on unaligned tensors (no TMA ring): its accumulator spreads over a
    // 2x2 warp grid.
    let mut k = kiln_examples::build("gemm", &[], false).expect("builds");
    run_pipeline(&mut k, Target::Sm90a, &mut |_, _| {}).expect("lowers");
    assert!(k.schedule.wgmma.is_empty());
    let note = k
        .schedule
        .notes
        .iter()
        .find(|n| n.text.contains("not wgmma"))
        .unwrap_or_else(|| panic!("no note: {:?}", k.schedule.notes));
    assert!(
        note.text.contains("warp grid is 2x2") && note.loc.to_string().contains("gemm.rs"),
        "{note:?}"
    );
    let m = kiln_ptx::compile(&k, Target::Sm90a).expect("compiles");
    assert!(m.ptx.contains("mma.sync") && !m.ptx.contains("wgmma.mma_async"));
    assert!(m.ptx.contains("warp grid is 2x2"), "the note is in the PTX");
}

/// What must hold of a kernel's PTX where wgmma runs without warp roles.
fn check_structure(name: &str, ptx: &str) {
    let lines: Vec<&str> = ptx
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("//"))
        .collect();
    assert!(!ptx.contains("mma.sync"), "{name}: mma.sync left");
    let mut groups = 0;
    let mut i = 0;
    while i < lines.len() {
        if lines[i] != "wgmma.fence.sync.aligned;" {
            assert!(
                !lines[i].starts_with("wgmma.mma_async") && !lines[i].starts_with("wgmma.commit"),
                "{name}: a wgmma outside a fenced group at line {i}: {}",
                lines[i]
            );
            i += 1;
            continue;
        }
        groups += 1;
        // The publishing barrier before the group follows a proxy fence.
        let bar = (0..i)
            .rev()
            .find(|&j| lines[j].starts_with("bar.sync"))
            .unwrap_or_else(|| panic!("{name}: no barrier before the wgmma at line {i}"));
        assert_eq!(
            lines[bar - 1],
            "fence.proxy.async.shared::cta;",
            "{name}: the barrier before the wgmma at line {i} publishes no async-proxy writes"
        );
        // Inside the group: only wgmmas and their descriptors' advance; no instruction
        // writes an accumulator register; then commit and wait for all.
        let mut acc: Vec<String> = Vec::new();
        let mut j = i + 1;
        let mut steps = 0;
        while !lines[j].starts_with("wgmma.commit_group") {
            let l = lines[j];
            if l.starts_with("wgmma.mma_async") {
                steps += 1;
                let regs = &l[l.find('{').expect("registers") + 1..l.find('}').expect("end")];
                let regs: Vec<String> = regs.split(", ").map(str::to_string).collect();
                if acc.is_empty() {
                    acc = regs;
                } else {
                    assert_eq!(acc, regs, "{name}: one accumulator per group");
                }
            } else {
                assert!(
                    l.starts_with("mov.b64") || l.starts_with("add.u32"),
                    "{name}: `{l}` inside a wgmma group"
                );
                let dest = l.split_whitespace().nth(1).unwrap_or("");
                assert!(
                    !acc.iter().any(|r| dest.contains(r.as_str())),
                    "{name}: `{l}` writes the accumulator"
                );
            }
            j += 1;
        }
        assert!(steps > 0, "{name}: an empty wgmma group");
        assert_eq!(
            lines[j + 1],
            "wgmma.wait_group.sync.aligned 0;",
            "{name}: a group not waited for at once"
        );
        i = j + 2;
    }
    assert!(groups > 0, "{name}: no wgmma");
    // Every cp.async wait that publishes a stage fences it into the async proxy.
    for w in lines.windows(2) {
        if w[0].starts_with("cp.async.wait_group") {
            assert!(!w[1].starts_with("bar.sync"), "{name}: `{}` unfenced", w[0]);
        }
    }
}

#[test]
fn sm90a_ptx_runs_every_mma_on_fenced_wgmma_groups() {
    for k in all_wgmma_kernels() {
        let m = kiln_ptx::compile(&k, Target::Sm90a).unwrap_or_else(|e| panic!("{}: {e}", k.name));
        check_structure(&k.name, &m.ptx);
        assert!(m.ptx.contains(".extern .shared .align 1024"), "{}", k.name);
    }
}

/// Each kernel assembles for sm_90a with no spill under the pinned ptxas and the driver
/// JIT's (CUDA 13.0), with no advisory (a serialised wgmma is one).
#[test]
fn sm90a_ptx_assembles_without_spills() {
    for tool in [Tool::Ptxas, Tool::JitPtxas] {
        if let Err(e) = ptxas::find(tool) {
            println!("skipped {}: {e}", tool.name());
            continue;
        }
        for k in all_wgmma_kernels() {
            let m = kiln_ptx::compile(&k, Target::Sm90a).expect("compiles");
            let r = ptxas::check_with(tool, &m.ptx, Target::Sm90a)
                .unwrap_or_else(|e| panic!("{} ({}): {e}", k.name, tool.name()));
            assert!(!r.spills(), "{} ({}) spills: {r}", k.name, tool.name());
            assert!(
                r.warnings.is_empty(),
                "{} ({}): advisories: {r}",
                k.name,
                tool.name()
            );
        }
    }
}

/// The PTX of the chained kernel at a head dim of 128: register A, boxed K-major and
/// MN-major descriptors, the proxy fences.
#[test]
fn wgmma_chain_ptx_snapshot() {
    let k = build(&wgmma_chain, WgmmaChainComptime::default());
    let m = kiln_ptx::compile(&k, Target::Sm90a).expect("compiles");
    let mut s = insta::Settings::clone_current();
    s.set_prepend_module_to_snapshot(false);
    s.set_snapshot_path("../snapshots/ptx");
    s.bind(|| insta::assert_snapshot!("wgmma_chain@sm_90a", m.ptx));
}

/// `kiln check` on sm_90a says how the backward's dK/dV kernel is lowered (wgmma without
/// warp roles, and why no warp roles) and, for a gemm whose accumulator is spread 1x4, why
/// its mma stays on mma.sync, at the user's lines.
#[test]
fn kiln_check_prints_the_lowering_notes() {
    if ptxas::find_ptxas().is_err() {
        return;
    }
    let check = |args: &[&str]| -> String {
        let all = ["kiln", "check"].into_iter().chain(args.iter().copied());
        kiln::cli::run_args(all).unwrap_or_else(|e| panic!("kiln check {args:?}: {e}"))
    };
    let out = check(&[
        "attention_bwd_dkdv",
        "--target",
        "sm_90a",
        "-D",
        "dtype=bf16",
    ]);
    assert!(
        out.contains("note: sm_90a: lowered with cp.async and wgmma")
            && out.contains("examples/src/attention_backward.rs:"),
        "{out}"
    );
    let out = check(&["gemm", "--target", "sm_90a", "-D", "BM=32"]);
    assert!(
        out.contains("note: sm_90a: this mma is lowered with mma.sync, not wgmma")
            && out.contains("warp grid is 1x4")
            && out.contains("examples/src/gemm.rs:"),
        "{out}"
    );
}
