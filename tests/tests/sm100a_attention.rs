//! The sm_100a (FlashAttention-4-style) schedule of the example attention: the `tmem` pass's
//! plan (roles, TMEM columns, descriptors, programs), `protocol_check` accepting it and
//! rejecting broken copies (one mutation per rule, each with its own error), the PTX issuing
//! each instruction from the role the plan names, ptxas 13.5 assembling every documented
//! variant without spills, and the spanned diagnostics where the schedule cannot go.
//! Nothing here runs on a GPU: no Blackwell is available.

mod ptx_examples;

use kiln_ir::passes::tmem::AttentionOptions;
use kiln_ir::passes::{PASSES, protocol_check};
use kiln_ir::sched::tmem::TmemTile;
use kiln_ir::sched::{BarrierId, BarrierKind, MmaPart, Op, Program, RoleKind, Sched};
use kiln_ir::{Kernel, Target};

/// `kernel` after every pass but `protocol_check` for sm_100a, the `tmem` pass with `options`.
fn scheduled_with(kernel: &Kernel, options: AttentionOptions) -> Kernel {
    let mut k = kernel.clone();
    for (name, _, pass) in PASSES {
        match *name {
            "protocol_check" => {}
            "tmem" => kiln_ir::passes::tmem::run_with(&mut k, Target::Sm100a, options)
                .unwrap_or_else(|d| panic!("tmem: {d}")),
            _ => pass(&mut k, Target::Sm100a).unwrap_or_else(|d| panic!("{name}: {d}")),
        }
    }
    k
}

/// The attention variant `set` after the passes (default options).
fn scheduled(set: &[(&str, &str)]) -> Kernel {
    scheduled_with(
        &ptx_examples::build("attention", set),
        AttentionOptions::default(),
    )
}

fn plan(k: &Kernel) -> Sched {
    k.schedule.sched.clone().expect("a schedule")
}

/// The barrier `name` (of Q tile `index`, if any).
fn bar(s: &Sched, name: &str, index: Option<u32>) -> BarrierId {
    let b = s
        .barriers
        .iter()
        .find(|(_, b)| b.name == name && b.index == index);
    b.unwrap_or_else(|| panic!("no barrier `{name}` {index:?}"))
        .0
}

/// Q tile `g`'s barrier `name`.
fn tile_bar(s: &Sched, name: &str, g: u32) -> BarrierId {
    bar(s, name, Some(g))
}

fn program(s: &mut Sched, kind: RoleKind) -> &mut Program {
    let r = s.roles.iter_mut().find(|r| r.kind == kind);
    &mut r.unwrap_or_else(|| panic!("no {kind} role")).program
}

/// The TMEM tile `name` of Q tile `g`.
fn tmem_tile(s: &Sched, name: &str, g: u32) -> TmemTile {
    let t = s.tmem.as_ref().expect("tensor memory");
    let tile = t.tile(name, Some(g)).expect("the tile");
    t.tiles[tile.0]
}

/// The first named barrier id of `bar`.
fn named_id(s: &Sched, bar: BarrierId) -> u32 {
    match s.barriers[bar].kind {
        BarrierKind::Named { first, .. } => first,
        BarrierKind::Mbarrier(_) => panic!("an mbarrier"),
    }
}

#[test]
fn plan_of_the_default_attention() {
    let k = scheduled(&[]);
    let p = plan(&k);
    // Each softmax warpgroup stores its tile through a staging tile and named barrier of its
    // own.
    let stores = &p.stores;
    assert_eq!(stores.len(), 2);
    assert_eq!((stores[0].work_tile, stores[1].work_tile), (0, 1));
    assert_eq!(
        (
            named_id(&p, stores[0].barrier),
            named_id(&p, stores[1].barrier)
        ),
        (1, 2)
    );
    assert_eq!((stores[0].threads, stores[0].rounds), (128, 1));
    assert_eq!(stores[1].offset, stores[0].offset + stores[0].bytes());
    // d = 128 with 128-key blocks: both staging tiles fit in two rounds.
    let wide = plan(&scheduled(&[("block_n", "128")]));
    assert_eq!(
        wide.stores.iter().map(|s| s.rounds).collect::<Vec<_>>(),
        [2, 2]
    );
    let role = |kind| p.role(kind).unwrap_or_else(|| panic!("no {kind} role"));
    assert_eq!(
        (
            role(RoleKind::Softmax(0)).warps,
            role(RoleKind::Softmax(1)).first_warp,
            role(RoleKind::Correction).first_warp,
            role(RoleKind::Producer).first_warp,
            role(RoleKind::Mma).first_warp,
        ),
        (4, 4, 8, 12, 13)
    );
    // 14 warps have roles; the block has 16, whole warpgroups for setmaxnreg (`roles_ptx`).
    assert_eq!(p.threads(), 14 * 32);
    // setmaxnreg: the whole register file, 128 * (2 * 192 + 80 + 48) = 65536.
    let regs = |kind| role(kind).regs.expect("a register count");
    let (softmax, correction, others) = (
        regs(RoleKind::Softmax(0)),
        regs(RoleKind::Correction),
        regs(RoleKind::Mma),
    );
    assert_eq!(regs(RoleKind::Softmax(1)), softmax);
    assert_eq!(regs(RoleKind::Producer), others);
    assert_eq!(128 * (2 * softmax + correction + others), 65536);
    // d = 128, 64-key blocks: O0, O1, S0, S1 in 384 of the 512 columns.
    let tmem = p.tmem.as_ref().expect("tensor memory");
    assert_eq!(tmem.columns, 512);
    assert_eq!(
        (0..2)
            .map(|g| (tmem_tile(&p, "O", g), tmem_tile(&p, "S", g)))
            .map(|(o, s)| (o.column, o.columns, s.column, s.columns))
            .collect::<Vec<_>>(),
        [(0, 128, 256, 64), (128, 128, 320, 64)]
    );
    // S = Q K^T: M 128, N 64, both K-major; O += P V: N 128, V MN-major (transpose B).
    let (head, tail) = (
        tmem.mma(MmaPart::Head).expect("S = Q K^T"),
        tmem.mma(MmaPart::Tail).expect("O += P V"),
    );
    assert_eq!((head.idesc, tail.idesc), (0x0810_0490, 0x0821_0490));
    assert_eq!(head.a.as_ref().expect("Q in shared memory").steps.len(), 8);
    assert!(tail.a.is_none(), "P is read from TMEM");
    assert_eq!(tail.b.steps, [0, 2048, 4096, 6144]);
    assert_eq!(p.poly_share, (1, 4));
    // f16: the A and B type codes (bits 7 and 10) are 0.
    let f16 = plan(&scheduled(&[("dtype", "f16")]));
    let f16 = f16.tmem.as_ref().expect("tensor memory");
    let idesc = |part| f16.mma(part).expect("an mma").idesc;
    assert_eq!(
        (idesc(MmaPart::Head), idesc(MmaPart::Tail)),
        (0x0810_0010, 0x0821_0010)
    );
    // The PV mma waits for P and for the rescaled O of its tile; the stage is released by a
    // commit after the last mma reading it.
    let it = &p
        .role(RoleKind::Mma)
        .expect("the MMA warp")
        .program
        .iteration;
    let at = |op: Op| it.iter().position(|x| *x == op).expect("an op");
    let empty = bar(&p, "empty", None);
    for g in 0..2 {
        let pv = at(Op::Tcgen05Mma {
            part: MmaPart::Tail,
            tile: g,
        });
        for name in ["p_full", "o_ready"] {
            let wait = Op::Wait {
                bar: tile_bar(&p, name, g),
                start: 0,
                lag: 0,
            };
            assert!(at(wait) < pv, "{name}");
        }
        assert!(pv < at(Op::Tcgen05Commit { bar: empty, lag: 0 }));
    }
    protocol_check::run(&mut k.clone(), Target::Sm100a).expect("the protocol holds");
}

/// One mutation of the schedule per rule, and the error each must give.
#[test]
fn protocol_check_rejects_broken_plans() {
    /// Removes the first `op` of `ops`.
    fn without(ops: &mut Vec<Op>, op: Op) {
        let at = ops.iter().position(|x| *x == op).expect("the op to remove");
        ops.remove(at);
    }
    fn wait(bar: BarrierId, start: u32) -> Op {
        Op::Wait { bar, start, lag: 0 }
    }
    fn mma(s: &mut Sched) -> &mut Program {
        program(s, RoleKind::Mma)
    }
    fn softmax(s: &mut Sched, g: u32) -> &mut Program {
        program(s, RoleKind::Softmax(g))
    }
    fn correction(s: &mut Sched) -> &mut Program {
        program(s, RoleKind::Correction)
    }
    type Edit = fn(&mut Sched);
    let edits: &[(&str, Edit)] = &[
        ("TMEM allocation of 1024 columns", |s| {
            if let Some(t) = s.tmem.as_mut() {
                t.columns = 1024;
            }
        }),
        ("relinquish the allocation permit", |s| {
            without(&mut s.setup, Op::TmemRelinquish)
        }),
        ("TMEM is allocated and freed by the MMA warp alone", |s| {
            softmax(s, 0).end.push(Op::TmemDealloc { columns: 512 })
        }),
        ("wait on every tile's o_empty", |s| {
            let o_empty = tile_bar(s, "o_empty", 1);
            without(&mut mma(s).exit, wait(o_empty, 1))
        }),
        ("signals only with tcgen05.commit", |s| {
            let p_full = tile_bar(s, "p_full", 0);
            let it = &mut softmax(s, 0).iteration;
            let last = it.len() - 1;
            it[last] = Op::Tcgen05Commit {
                bar: p_full,
                lag: 0,
            };
        }),
        ("tcgen05.wait::ld missing", |s| {
            without(&mut softmax(s, 1).iteration, Op::TmemWaitLoad)
        }),
        ("tcgen05.wait::st missing", |s| {
            without(&mut correction(s).iteration, Op::TmemWaitStore)
        }),
        ("fence::after_thread_sync", |s| {
            without(&mut softmax(s, 0).end, Op::Tcgen05FenceAfter)
        }),
        ("fence::before_thread_sync", |s| {
            without(&mut softmax(s, 0).iteration, Op::Tcgen05FenceBefore)
        }),
        ("deadlock", |s| {
            let s_full = tile_bar(s, "s_full", 0);
            without(
                &mut mma(s).iteration,
                Op::Tcgen05Commit {
                    bar: s_full,
                    lag: 0,
                },
            )
        }),
        // The PV mma issued before the correction rescaled O.
        ("O0 (TMEM) is written by the correction", |s| {
            let o_ready = tile_bar(s, "o_ready", 0);
            without(&mut mma(s).iteration, wait(o_ready, 0))
        }),
        // The PV mma issued before the softmax wrote P over S.
        ("S1 (TMEM)", |s| {
            let p_full = tile_bar(s, "p_full", 1);
            without(&mut mma(s).iteration, wait(p_full, 0))
        }),
        // The correction reads the factors before the softmax wrote them. (Without its
        // `o_full` wait it would still be ordered after the previous PV mma: the softmax's
        // `s_full` of this iteration is committed after that mma, and the factors' handoff
        // follows it; the wait keeps the order direct.)
        ("the rescale factors of tile 1", |s| {
            let scale_full = tile_bar(s, "scale_full", 1);
            without(&mut correction(s).iteration, wait(scale_full, 0))
        }),
        // The stage released before the PV mmas reading V.
        ("of tma1 (shared memory)", |s| {
            let release = Op::Tcgen05Commit {
                bar: bar(s, "empty", None),
                lag: 0,
            };
            let it = &mut mma(s).iteration;
            without(it, release);
            let pv = it
                .iter()
                .position(|op| {
                    *op == Op::Tcgen05Mma {
                        part: MmaPart::Tail,
                        tile: 0,
                    }
                })
                .expect("a PV mma");
            it.insert(pv, release);
        }),
        // Softmax 1 stores through softmax 0's named barrier.
        (
            "a staging tile and a named barrier (not 0) of their own",
            |s| {
                let first = named_id(s, s.stores[0].barrier);
                let theirs = s.stores[1].barrier;
                if let BarrierKind::Named { first: f, .. } = &mut s.barriers[theirs].kind {
                    *f = first;
                }
            },
        ),
        ("softmax 1's epilogue store", |s| {
            s.stores[1].round.retain(|op| *op != Op::FenceProxyAsync);
        }),
        // Softmax warpgroups that do not wait for their Q run through empty tiles two o_empty
        // phases ahead of the MMA thread.
        ("its parity would pass on the wrong phase", |s| {
            softmax(s, 0).tile.clear();
            softmax(s, 1).tile.clear();
        }),
    ];
    for (expect, edit) in edits {
        let mut k = scheduled(&[]);
        if let Some(s) = k.schedule.sched.as_mut() {
            edit(s);
        }
        let d = protocol_check::run(&mut k, Target::Sm100a).expect_err(expect);
        let text = d.to_string();
        assert!(text.contains(expect), "expected `{expect}`, got: {text}");
        // A diagnostic at the user's loop, not a panic.
        assert!(text.contains("examples/src/attention.rs"), "{text}");
    }
}

/// The PTX of `set`, cut where the roles start: set-up, the last warpgroup's split, the load
/// warp, the MMA warp, softmax warpgroups 0 and 1, the correction warpgroup.
fn roles_ptx(set: &[(&str, &str)]) -> Vec<String> {
    let k = ptx_examples::build("attention", set);
    let m = kiln_ptx::compile(&k, Target::Sm100a).expect("compile");
    assert_eq!(m.threads_per_block, 512);
    assert!(m.persistent);
    let ptx = m.ptx;
    assert!(ptx.contains(".version 8.6\n.target sm_100a\n"));
    assert!(ptx.contains(".maxntid 512, 1, 1\n.minnctapersm 1"));
    assert!(!ptx.contains("wgmma"));
    let marks = [
        "// last warpgroup:",
        "// load warp:",
        "// mma warp:",
        "// softmax warpgroup 0:",
        "// softmax warpgroup 1:",
        "// correction warpgroup:",
    ];
    let cuts: Vec<usize> = marks
        .iter()
        .map(|m| ptx.find(m).unwrap_or_else(|| panic!("no `{m}`")))
        .collect();
    assert!(cuts.windows(2).all(|w| w[0] < w[1]));
    let mut parts = vec![ptx[..cuts[0]].to_string()];
    for (i, &c) in cuts.iter().enumerate() {
        let end = cuts.get(i + 1).copied().unwrap_or(ptx.len());
        parts.push(ptx[c..end].to_string());
    }
    parts
}

/// Instructions of `code` (comments dropped) whose text starts with `op` after any guard.
fn count(code: &str, op: &str) -> usize {
    code.lines()
        .map(|l| l.trim())
        .filter(|l| !l.starts_with("//"))
        .map(|l| match l.strip_prefix('@') {
            Some(rest) => rest.split_once(' ').map_or("", |(_, i)| i),
            None => l,
        })
        .filter(|l| l.starts_with(op))
        .count()
}

#[test]
fn each_role_issues_its_own_instructions() {
    // d = 128 with 64-key blocks, and d = 64 with 128-key blocks (the kernel's choices).
    for (set, d, bn) in [(&[][..], 128, 64), (&[("d", "64")][..], 64, 128)] {
        let parts = roles_ptx(set);
        let [setup, split, load, mma, soft0, soft1, correction] = &parts[..] else {
            panic!("seven parts");
        };
        let all = parts.concat();
        // Only the MMA warp allocates, frees and issues mmas; only the load warp TMA.
        for (op, owner) in [
            ("tcgen05.alloc", setup),
            ("tcgen05.relinquish_alloc_permit", setup),
            ("tcgen05.dealloc", mma),
            ("tcgen05.mma", mma),
            ("tcgen05.commit", mma),
            ("cp.async.bulk.tensor.4d.shared::cluster.global", load),
        ] {
            assert_eq!(count(&all, op), count(owner, op), "{op} outside its role");
            assert!(count(owner, op) > 0, "{op}");
        }
        assert_eq!(
            count(
                setup,
                "tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32"
            ),
            1
        );
        assert!(setup.contains(", 512;"), "512 columns");
        assert_eq!(count(split, "setmaxnreg.dec.sync.aligned.u32 48"), 1);
        // Both Q tiles and K, V: one box per 64 columns each.
        assert_eq!(count(load, "cp.async.bulk.tensor"), 4 * d / 64);
        // The TMA stores: each softmax warpgroup its own tile's boxes.
        let stores = "cp.async.bulk.tensor.4d.global.shared::cta";
        assert_eq!(
            count(soft0, stores) + count(soft1, stores),
            count(&all, stores)
        );
        // S = Q K^T: d / 16 mmas a tile; O += P V: block_n / 16, A from TMEM.
        assert_eq!(
            count(mma, "tcgen05.mma.cta_group::1.kind::f16"),
            2 * (d / 16 + bn / 16)
        );
        assert_eq!(
            mma.lines()
                .filter(|l| l.contains("tcgen05.mma") && l.contains("], ["))
                .count(),
            2 * bn / 16,
            "P read from TMEM"
        );
        // s_full and o_full of both tiles, the stage, the Q tiles.
        assert_eq!(count(mma, "tcgen05.commit"), 6);
        for (g, soft) in [soft0, soft1].into_iter().enumerate() {
            assert_eq!(count(soft, "setmaxnreg.inc.sync.aligned.u32 192"), 1, "{g}");
            // S in 32-column copies, then O after the loop; P written over S (and zeros in
            // the no-op iterations past the tile's own last key block).
            assert_eq!(
                count(soft, "tcgen05.ld.sync.aligned.32x32b.x32"),
                bn / 32 + d / 32
            );
            assert_eq!(
                count(soft, "tcgen05.st.sync.aligned.32x32b.x32"),
                2 * (bn / 64)
            );
            assert_eq!(count(soft, "tcgen05.wait::ld"), 3);
            assert_eq!(count(soft, "tcgen05.wait::st"), 2);
            // A quarter of the score tile's exponentials on the FMA pipes, the rest and the
            // rescale factor on the MUFU.
            assert_eq!(count(soft, "cvt.rmi.f32.f32"), bn / 4);
            assert_eq!(count(soft, "ex2.approx.ftz.f32"), 3 * bn / 4 + 1);
            assert_eq!(
                count(soft, "st.shared.f32"),
                2,
                "the rescale factor, 1 when no-op"
            );
            assert_eq!(count(soft, stores), d / 64, "the output, through TMA");
            assert_eq!(count(soft, "st.global"), 0);
            assert_eq!(count(soft, &format!("bar.sync {}, 128", g + 1)), 2);
            assert_eq!(count(soft, "shfl.sync"), 0, "a row per thread: no shuffles");
        }
        assert_eq!(count(correction, "setmaxnreg.dec.sync.aligned.u32 80"), 1);
        // Per tile: the factor, a warp vote, d / 32 copies out and back.
        assert_eq!(count(correction, "ld.shared.f32"), 2);
        assert_eq!(count(correction, "vote.sync.all.pred"), 2);
        assert_eq!(
            count(correction, "tcgen05.ld.sync.aligned.32x32b.x32"),
            2 * d / 32
        );
        assert_eq!(
            count(correction, "tcgen05.st.sync.aligned.32x32b.x32"),
            2 * d / 32
        );
        // d multiplies per tile, and each tile's softmax scale among the scalar ops before the
        // loop that give the pair's walk (dead there; ptxas drops them).
        assert_eq!(count(correction, "mul.f32"), 2 * d + 2);
        for op in ["ex2", "st.global", "tcgen05.mma"] {
            assert_eq!(count(correction, op), 0, "{op} in the correction");
        }
    }
}

#[test]
fn variants_assemble_without_spills() {
    for set in [
        &[][..],
        &[("causal", "true")],
        &[("d", "64")],
        &[("d", "64"), ("causal", "true")],
        &[("kv_group", "2")],
        &[("d", "64"), ("causal", "true"), ("kv_group", "4")],
        &[("block_n", "128")],
        &[("block_n", "128"), ("causal", "true")],
        // The features of `examples/src/attention.rs` beyond the default: f16 (the mma kind's
        // type codes 0), sliding windows (one tile's walk may start later than the other's:
        // its extra iterations are no-ops), a two-sided window with causal, soft-capping,
        // d = 96 (d = 128's kernel).
        &[("dtype", "f16")],
        &[("window_left", "256")],
        &[
            ("window_left", "128"),
            ("window_right", "0"),
            ("causal", "true"),
        ],
        &[("window_left", "64"), ("d", "64"), ("dtype", "f16")],
        &[("softcap", "30.0")],
        &[("d", "96"), ("kv_group", "2")],
    ] {
        let k = ptx_examples::build("attention", set);
        let m = kiln_ptx::compile(&k, Target::Sm100a).unwrap_or_else(|e| panic!("{set:?}: {e}"));
        let report = kiln_ptx::ptxas::check(&m.ptx, Target::Sm100a)
            .unwrap_or_else(|e| panic!("{set:?}: {e}"));
        assert!(!report.spills(), "{set:?}: {report}");
        assert!(report.warnings.is_empty(), "{set:?}: {report}");
    }
}

#[test]
fn the_exp2_share_is_a_pass_option() {
    let kernel = ptx_examples::build("attention", &[]);
    for (share, poly) in [((0, 1), 0), ((1, 2), 32), ((1, 1), 64)] {
        let k = scheduled_with(
            &kernel,
            AttentionOptions {
                poly_exp2_share: share,
            },
        );
        let ptx = kiln_ptx::writer::Writer::new(&k, Target::Sm100a)
            .write()
            .expect("write")
            .ptx;
        let soft = &ptx[ptx.find("// softmax warpgroup 0:").expect("softmax")
            ..ptx.find("// softmax warpgroup 1:").expect("softmax 1")];
        assert_eq!(count(soft, "cvt.rmi.f32.f32"), poly, "{share:?}");
        assert_eq!(
            count(soft, "ex2.approx.ftz.f32"),
            64 - poly + 1,
            "{share:?}"
        );
    }
}

#[test]
fn d256_is_a_spanned_diagnostic() {
    let k = ptx_examples::build("attention", &[("d", "256")]);
    let text = kiln_ptx::compile(&k, Target::Sm100a)
        .expect_err("does not fit TMEM")
        .to_string();
    assert!(text.contains("2 x (256 + 64) = 640 TMEM columns"), "{text}");
    assert!(text.contains("examples/src/attention.rs"), "{text}");
}

/// ptxas honours each role's `setmaxnreg`: in the machine code after each `USETMAXREG` (up
/// to the next), no register at or past its count is used, although the kernel's entry count
/// (`.maxntid 512`) is 128 and the softmax warpgroups use more.
#[test]
fn each_role_fits_its_register_count() {
    let k = ptx_examples::build("attention", &[("block_n", "128")]);
    let m = kiln_ptx::compile(&k, Target::Sm100a).expect("compile");
    let sass = kiln_ptx::ptxas::sass(&m.ptx, Target::Sm100a).expect("ptxas and nvdisasm");
    let lines: Vec<&str> = sass.lines().collect();
    let marks: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i].contains("USETMAXREG"))
        .collect();
    let limits: Vec<u32> = marks
        .iter()
        .map(|&i| {
            let hex = lines[i].rsplit("0x").next().unwrap_or("");
            u32::from_str_radix(hex.trim_end_matches([' ', ';']), 16).expect("a count")
        })
        .collect();
    assert_eq!(limits, [48, 80, 192, 192], "{:?}", marks);
    let mut most = Vec::new();
    for (n, &at) in marks.iter().enumerate() {
        let end = marks.get(n + 1).copied().unwrap_or(lines.len());
        let top = lines[at..end]
            .iter()
            .flat_map(|l| {
                l.split(|c: char| !c.is_ascii_alphanumeric())
                    .filter_map(|w| w.strip_prefix('R')?.parse::<u32>().ok())
            })
            .max()
            .unwrap_or(0);
        assert!(top < limits[n], "R{top} after setmaxnreg {}", limits[n]);
        most.push(top);
    }
    assert!(
        most[2] >= 128,
        "the softmax uses the registers it asked for: {most:?}"
    );
}
