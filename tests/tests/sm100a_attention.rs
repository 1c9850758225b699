//! The sm_100a (FlashAttention-4-style) schedule of the example attention: the `tmem` pass's
//! plan (roles, TMEM columns, descriptors, programs), `protocol_check` accepting it and
//! rejecting broken copies (one mutation per rule, each with its own error), the PTX issuing
//! each instruction from the role the plan names, ptxas 13.5 assembling every documented
//! variant without spills, and the spanned diagnostics where the schedule cannot go.
//! Nothing here runs on a GPU: no Blackwell is available.

mod ptx_examples;

use kiln_ir::passes::tmem::AttentionOptions;
use kiln_ir::passes::{PASSES, protocol_check};
use kiln_ir::ring::Bar;
use kiln_ir::tmem::attention::{AttentionPlan, AttnBar, AttnStep};
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

fn plan(k: &Kernel) -> AttentionPlan {
    k.schedule.attention.clone().expect("an attention plan")
}

#[test]
fn plan_of_the_default_attention() {
    let k = scheduled(&[]);
    assert!(k.schedule.tmem.is_none());
    // Each softmax warpgroup stores its tile through a staging tile and named barrier of its
    // own (tile 0's is the schedule's entry, whose tensor map the runtime builds).
    let stores = &k.schedule.attention.as_ref().expect("a plan").stores;
    assert_eq!(stores.len(), 2);
    assert_eq!(k.schedule.tma_stores.values().next(), Some(&stores[0]));
    assert_eq!((stores[0].barrier, stores[1].barrier), (1, 2));
    assert_eq!((stores[0].threads, stores[0].rounds), (128, 1));
    assert_eq!(stores[1].offset, stores[0].offset + stores[0].bytes());
    // d = 128 with 128-key blocks: both staging tiles fit in two rounds.
    let wide = plan(&scheduled(&[("block_n", "128")]));
    assert_eq!(
        wide.stores.iter().map(|s| s.rounds).collect::<Vec<_>>(),
        [2, 2]
    );
    let p = plan(&k);
    let r = p.roles;
    assert_eq!(
        (
            r.softmax_warps,
            r.correction_warp,
            r.load_warp,
            r.mma_warp,
            r.warps
        ),
        (4, 8, 12, 13, 16)
    );
    assert_eq!(r.threads(), 512);
    // setmaxnreg: the whole register file, 128 * (2 * 192 + 80 + 48) = 65536.
    assert_eq!(128 * (2 * r.regs[0] + r.regs[1] + r.regs[2]), 65536);
    // d = 128, 64-key blocks: O0, O1, S0, S1 in 384 of the 512 columns.
    assert_eq!((p.d, p.block_n, p.columns), (128, 64, 512));
    assert_eq!(
        p.tiles.iter().map(|t| (t.o, t.s)).collect::<Vec<_>>(),
        [(0, 256), (128, 320)]
    );
    // S = Q K^T: M 128, N 64, both K-major; O += P V: N 128, V MN-major (transpose B).
    assert_eq!(p.s_idesc, 0x0810_0490);
    assert_eq!(p.o_idesc, 0x0821_0490);
    assert_eq!(p.q.steps.len(), 8);
    assert_eq!(p.v.steps, [0, 2048, 4096, 6144]);
    assert_eq!(p.poly_share, (1, 4));
    // f16: the A and B type codes (bits 7 and 10) are 0.
    let f16 = plan(&scheduled(&[("dtype", "f16")]));
    assert_eq!((f16.s_idesc, f16.o_idesc), (0x0810_0010, 0x0821_0010));
    // The PV mma waits for P and for the rescaled O of its tile; the stage is released by a
    // commit after the last mma reading it.
    let it = &p.mma_iteration;
    let at = |s: AttnStep| it.iter().position(|x| *x == s).expect("a step");
    for g in 0..2 {
        let pv = at(AttnStep::MmaO { tile: g });
        for bar in [AttnBar::PFull(g), AttnBar::OReady(g)] {
            assert!(
                at(AttnStep::Wait {
                    bar,
                    start: 0,
                    lag: 0
                }) < pv
            );
        }
        assert!(pv < at(AttnStep::RingCommit { bar: Bar::Empty }));
    }
    protocol_check::run(&mut k.clone(), Target::Sm100a).expect("the protocol holds");
}

/// One mutation of the plan per rule, and the error each must give.
#[test]
fn protocol_check_rejects_broken_plans() {
    fn without(steps: &mut Vec<AttnStep>, s: AttnStep) {
        let at = steps
            .iter()
            .position(|x| *x == s)
            .expect("the step to remove");
        steps.remove(at);
    }
    type Edit = fn(&mut AttentionPlan);
    let edits: &[(&str, Edit)] = &[
        ("TMEM allocation of 1024 columns", |p| {
            p.columns = 1024;
        }),
        ("relinquish the allocation permit", |p| {
            without(&mut p.setup, AttnStep::Relinquish)
        }),
        ("TMEM is allocated and freed by the MMA warp alone", |p| {
            p.softmax_end[0].push(AttnStep::Dealloc { columns: 512 })
        }),
        ("wait on every tile's o_empty", |p| {
            without(
                &mut p.mma_exit,
                AttnStep::Wait {
                    bar: AttnBar::OEmpty(1),
                    start: 1,
                    lag: 0,
                },
            )
        }),
        ("signals only with tcgen05.commit", |p| {
            let s = &mut p.softmax_iteration[0];
            let last = s.len() - 1;
            s[last] = AttnStep::Commit {
                bar: AttnBar::PFull(0),
            };
        }),
        ("tcgen05.wait::ld missing", |p| {
            without(&mut p.softmax_iteration[1], AttnStep::WaitLd)
        }),
        ("tcgen05.wait::st missing", |p| {
            without(&mut p.correction_iteration, AttnStep::WaitSt)
        }),
        ("fence::after_thread_sync", |p| {
            without(&mut p.softmax_end[0], AttnStep::FenceAfter)
        }),
        ("fence::before_thread_sync", |p| {
            without(&mut p.softmax_iteration[0], AttnStep::FenceBefore)
        }),
        ("deadlock", |p| {
            without(
                &mut p.mma_iteration,
                AttnStep::Commit {
                    bar: AttnBar::SFull(0),
                },
            )
        }),
        // The PV mma issued before the correction rescaled O.
        ("O0 (TMEM) is written by the correction", |p| {
            without(
                &mut p.mma_iteration,
                AttnStep::Wait {
                    bar: AttnBar::OReady(0),
                    start: 0,
                    lag: 0,
                },
            )
        }),
        // The PV mma issued before the softmax wrote P over S.
        ("S1 (TMEM)", |p| {
            without(
                &mut p.mma_iteration,
                AttnStep::Wait {
                    bar: AttnBar::PFull(1),
                    start: 0,
                    lag: 0,
                },
            )
        }),
        // The correction reads the factors before the softmax wrote them. (Without its
        // `o_full` wait it would still be ordered after the previous PV mma: the softmax's
        // `s_full` of this iteration is committed after that mma, and the factors' handoff
        // follows it; the wait keeps the order direct.)
        ("the rescale factors of tile 1", |p| {
            without(
                &mut p.correction_iteration,
                AttnStep::Wait {
                    bar: AttnBar::ScaleFull(1),
                    start: 0,
                    lag: 0,
                },
            )
        }),
        // The stage released before the PV mmas reading V.
        ("of tma1 (shared memory)", |p| {
            let it = &mut p.mma_iteration;
            without(it, AttnStep::RingCommit { bar: Bar::Empty });
            let pv = it
                .iter()
                .position(|s| *s == AttnStep::MmaO { tile: 0 })
                .expect("a PV mma");
            it.insert(pv, AttnStep::RingCommit { bar: Bar::Empty });
        }),
        (
            "a staging tile and a named barrier (not 0) of their own",
            |p| {
                p.stores[1].barrier = p.stores[0].barrier;
            },
        ),
        ("softmax 1's epilogue store", |p| {
            p.stores[1]
                .round
                .retain(|s| *s != kiln_ir::tma_store::StoreStep::Fence);
        }),
        // Softmax warpgroups that do not wait for their Q run through empty tiles two o_empty
        // phases ahead of the MMA thread.
        ("its parity would pass on the wrong phase", |p| {
            p.softmax_tile[0].clear();
            p.softmax_tile[1].clear();
        }),
    ];
    for (expect, edit) in edits {
        let mut k = scheduled(&[]);
        if let Some(p) = k.schedule.attention.as_mut() {
            edit(p);
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
