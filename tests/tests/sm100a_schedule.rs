//! The sm_100a schedule of the example gemm (B row- and column-major): the `pipeline` pass
//! plans the same TMA ring as on sm_90a with a single-thread tcgen05 consumer, `persistent`
//! the same tile walk, the `tmem` pass the accumulator, roles and descriptors, `protocol_check` accepts them and rejects broken
//! copies with a diagnostic; the PTX issues each instruction from the warp the plan names.
//! Nothing here runs on a GPU: no Blackwell is available, so the schedule is proved by these
//! checks and by ptxas (`ptx_snapshots`).

mod ptx_examples;

use kiln_ir::passes::PASSES;
use kiln_ir::passes::protocol_check::{self, ProtocolError, TmemError, TmemRule};
use kiln_ir::sched::tma::Operand;
use kiln_ir::sched::tmem::{TmemMma, TmemTile};
use kiln_ir::sched::{BarrierId, MmaPart, Op, Program, Region, RoleKind, Sched};
use kiln_ir::{Kernel, Target};

/// `kernel` after every pass but `protocol_check`, for sm_100a.
fn scheduled(kernel: &Kernel) -> Kernel {
    let mut k = kernel.clone();
    for (name, _, pass) in PASSES {
        if *name != "protocol_check" {
            pass(&mut k, Target::Sm100a).unwrap_or_else(|d| panic!("{name}: {d}"));
        }
    }
    k
}

/// The schedule IR `protocol_check` proves for `kernel` with `set` on sm_100a.
fn sched(kernel: &str, set: &[(&str, &str)]) -> Sched {
    let mut k = scheduled(&ptx_examples::build(kernel, set));
    protocol_check::run(&mut k, Target::Sm100a).unwrap_or_else(|d| panic!("{d}"));
    k.schedule.sched.expect("a schedule")
}

fn program(s: &mut Sched, kind: RoleKind) -> &mut Program {
    let r = s.roles.iter_mut().find(|r| r.kind == kind);
    &mut r.unwrap_or_else(|| panic!("no {kind} role")).program
}

fn mma(s: &mut Sched) -> &mut Program {
    program(s, RoleKind::Mma)
}

/// The epilogue's code after the loop: its copies out of TMEM, hand-back and reads.
fn epilogue(s: &mut Sched) -> &mut Vec<Op> {
    &mut program(s, RoleKind::Epilogue).end
}

fn bar(s: &Sched, name: &str) -> BarrierId {
    let b = s.barriers.iter().find(|(_, b)| b.name == name);
    b.unwrap_or_else(|| panic!("no barrier `{name}`")).0
}

/// The arrival count of mbarrier `name`.
fn arrivals(s: &Sched, name: &str) -> u32 {
    s.mbarrier(bar(s, name)).expect("an mbarrier").count
}

/// The allocation's columns and its accumulator tile.
fn acc(s: &Sched) -> (u32, TmemTile) {
    let t = s.tmem.as_ref().expect("tensor memory");
    let acc = t
        .tiles
        .iter()
        .find(|t| t.name == "acc")
        .expect("an accumulator");
    (t.columns, *acc)
}

/// The mainloop's mma: its instruction and operand descriptors.
fn mainloop_mma(s: &Sched) -> &TmemMma {
    let t = s.tmem.as_ref().expect("tensor memory");
    t.mma(MmaPart::Body).expect("the mainloop's mma")
}

/// `(epilogue warps, producer warp, MMA warp, threads)`.
fn warps(s: &Sched) -> (u32, u32, u32, u32) {
    let role = |k| s.role(k).unwrap_or_else(|| panic!("no {k} role"));
    (
        role(RoleKind::Epilogue).warps,
        role(RoleKind::Producer).first_warp,
        role(RoleKind::Mma).first_warp,
        s.threads(),
    )
}

/// The gemm's schedule IR on sm_100a, as the passes write it.
fn gemm(b_col_major: &str) -> Sched {
    let k = scheduled(&ptx_examples::build(
        "gemm",
        &[("b_col_major", b_col_major)],
    ));
    let s = k.schedule.sched.expect("a schedule");
    // Persistent CTAs in the gemm's grouped order, as on sm_90a.
    assert!(s.persistent());
    assert!(matches!(
        s.tiles,
        Some(kiln_ir::sched::tiles::TileScheduler::Grouped { rows: 8 })
    ));
    s
}

#[test]
fn gemm_ring_and_tmem_plan() {
    // bf16 x bf16 -> f32, M = 128 (bits 24-28: 8), N = 128 (bits 17-22: 16); B row-major is
    // MN-major (transpose-B bit 16), column-major B K-major like A (docs/ptx.md §7).
    for (b_col_major, operand, idesc, b_template) in [
        (
            "false",
            Operand::MnMajorB,
            0x0821_0490,
            // LBO = the 64-column boxes' distance (64 K-rows x 128 B), SBO = 1024, SW128.
            0x4000_4040_0200_0000u64,
        ),
        ("true", Operand::KMajorB, 0x0820_0490, 0x4000_4040_0001_0000),
    ] {
        let mut s = gemm(b_col_major);
        let counts = (arrivals(&s, "full"), arrivals(&s, "empty"));
        assert_eq!((s.stages, counts), (3, (1, 1)));
        let b = &s.ring_loads().nth(1).expect("B's load").1.tma;
        assert_eq!(b.operand, operand);
        let (full, empty) = (bar(&s, "full"), bar(&s, "empty"));
        assert_eq!(
            mma(&mut s).iteration,
            [
                Op::Wait {
                    bar: full,
                    start: 0,
                    lag: 0
                },
                Op::Tcgen05Mma {
                    part: MmaPart::Body,
                    tile: 0
                },
                Op::Tcgen05Commit { bar: empty, lag: 0 },
            ]
        );
        assert!(mma(&mut s).drain.is_empty());
        let (columns, acc_tile) = acc(&s);
        assert_eq!((columns, acc_tile.columns), (128, 128));
        let plan = mainloop_mma(&s);
        assert_eq!(plan.idesc, idesc);
        // K-major SW128 A: bit 46, swizzle code 2, SBO 1024, LBO 16; k16 steps 32 B apart.
        let a = plan.a.as_ref().expect("A in shared memory");
        assert_eq!(a.template, 0x4000_4040_0001_0000);
        assert_eq!(a.steps, [0, 32, 64, 96]);
        assert_eq!(plan.b.template, b_template);
        let b_steps: &[u32] = if operand == Operand::MnMajorB {
            &[0, 2048, 4096, 6144]
        } else {
            &[0, 32, 64, 96]
        };
        assert_eq!(plan.b.steps, b_steps);
        assert_eq!(warps(&s), (4, 4, 5, 192));
        protocol_check::check(&sched("gemm", &[("b_col_major", b_col_major)]))
            .expect("the planned protocol is sound");
    }
}

/// A deliberate break of the schedule.
type Edit = fn(&mut Sched);

/// Whether an error is the one a break must give.
type Expect = fn(&ProtocolError) -> bool;

fn tmem(e: &ProtocolError) -> Option<&TmemError> {
    match e {
        ProtocolError::Tmem(t) => Some(t),
        _ => None,
    }
}

/// Applies each break to a copy of `real` and checks the error: its kind, and a fragment of
/// its message.
fn each_rejected(real: &Sched, edits: &[(&str, Edit, Expect)]) {
    protocol_check::check(real).expect("the planned protocol is sound");
    for &(expect, edit, kind) in edits {
        let mut s = real.clone();
        edit(&mut s);
        let e = protocol_check::check(&s).expect_err(expect);
        assert!(kind(&e), "`{expect}`: the wrong kind of error: {e}");
        let text = e.to_string();
        assert!(text.contains(expect), "expected `{expect}`, got: {text}");
    }
}

fn without(ops: &mut Vec<Op>, op: Op) {
    ops.retain(|x| *x != op);
}

/// The `tcgen05.ld` copying `columns` columns of the accumulator from `column`.
fn copy(s: &Sched, column: u32, columns: u32) -> Op {
    let tile = s
        .roles
        .iter()
        .flat_map(|r| r.program.ops())
        .find_map(|op| match op {
            Op::TmemLoad { tile, .. } => Some(tile),
            _ => None,
        });
    Op::TmemLoad {
        tile: tile.expect("a copy out of TMEM"),
        column,
        columns,
    }
}

#[test]
fn broken_schedules_are_rejected() {
    let edits: [(&str, Edit, Expect); 12] = [
        (
            "power of 2 from 32 to 512",
            |s| {
                if let Some(t) = s.tmem.as_mut() {
                    t.columns = 1024;
                }
                let mma = s.roles.iter_mut().find(|r| r.kind == RoleKind::Mma);
                let exit = &mut mma.expect("the MMA role").program.exit;
                for op in s.setup.iter_mut().chain(exit) {
                    if let Op::TmemAlloc { columns } | Op::TmemDealloc { columns } = op {
                        *columns = 1024;
                    }
                }
            },
            |e| matches!(tmem(e), Some(TmemError::Columns { columns: 1024, .. })),
        ),
        // The old message named the accumulator; the allocation now holds every TMEM tile.
        (
            "holding every tile (128 columns)",
            |s| {
                if let Some(t) = s.tmem.as_mut() {
                    t.columns = 64;
                }
            },
            |e| {
                matches!(
                    tmem(e),
                    Some(TmemError::Columns {
                        columns: 64,
                        needed: 128
                    })
                )
            },
        ),
        (
            "relinquish the allocation permit",
            |s| without(&mut s.setup, Op::TmemRelinquish),
            |e| matches!(tmem(e), Some(TmemError::Owner(_))),
        ),
        (
            "allocated and freed by the MMA warp alone",
            |s| {
                let free = mma(s).exit.pop().expect("the free");
                assert!(matches!(free, Op::TmemDealloc { .. }));
                epilogue(s).push(free);
            },
            |e| matches!(tmem(e), Some(TmemError::Rule { role, rule: TmemRule::NotOwner, .. }) if role == "epilogue"),
        ),
        // A tile's mmas would overwrite the accumulator the epilogue still copies.
        (
            "before a tile's mmas overwrite it",
            |s| {
                let handback = Op::Wait {
                    bar: bar(s, "acc_empty"),
                    start: 1,
                    lag: 0,
                };
                without(&mut mma(s).tile, handback);
            },
            |e| matches!(tmem(e), Some(TmemError::Owner(_))),
        ),
        // From parity 0, the first tile's wait would hang on a fresh barrier.
        (
            "from parity 1",
            |s| {
                let acc_empty = bar(s, "acc_empty");
                mma(s).tile[0] = Op::Wait {
                    bar: acc_empty,
                    start: 0,
                    lag: 0,
                };
            },
            |e| matches!(tmem(e), Some(TmemError::Owner(_))),
        ),
        (
            "before freeing the columns",
            |s| {
                let handback = Op::Wait {
                    bar: bar(s, "acc_empty"),
                    start: 1,
                    lag: 0,
                };
                without(&mut mma(s).exit, handback);
            },
            |e| matches!(tmem(e), Some(TmemError::Owner(_))),
        ),
        (
            "commit the accumulator to acc_full",
            |s| {
                let commit = Op::Tcgen05Commit {
                    bar: bar(s, "acc_full"),
                    lag: 0,
                };
                without(&mut mma(s).end, commit);
            },
            |e| matches!(tmem(e), Some(TmemError::Owner(_))),
        ),
        (
            "only tcgen05.commit arrives",
            |s| {
                let empty = bar(s, "empty");
                mma(s).iteration[2] = Op::Arrive { bar: empty, lag: 0 };
            },
            |e| matches!(tmem(e), Some(TmemError::PlainRelease(_))),
        ),
        // The old message named acc_full; the new one the accumulator's barrier.
        (
            "before waiting on the accumulator's barrier",
            |s| {
                let wait = Op::Wait {
                    bar: bar(s, "acc_full"),
                    start: 0,
                    lag: 0,
                };
                without(epilogue(s), wait);
            },
            |e| {
                matches!(
                    tmem(e),
                    Some(TmemError::Rule {
                        rule: TmemRule::LoadBeforeCommit,
                        ..
                    })
                )
            },
        ),
        (
            "tcgen05.wait::ld missing",
            |s| {
                // The copies are waited for only after the registers were read.
                without(epilogue(s), Op::TmemWaitLoad);
                epilogue(s).push(Op::TmemWaitLoad);
            },
            |e| {
                matches!(
                    tmem(e),
                    Some(TmemError::Rule {
                        rule: TmemRule::NotWaited("ld"),
                        ..
                    })
                )
            },
        ),
        (
            "arrive on acc_empty exactly once",
            |s| {
                let handback = Op::Arrive {
                    bar: bar(s, "acc_empty"),
                    lag: 0,
                };
                without(epilogue(s), handback);
            },
            |e| matches!(tmem(e), Some(TmemError::NoHandBack)),
        ),
    ];
    let real = sched("gemm", &[("b_col_major", "false")]);
    each_rejected(&real, &edits);
    // Two epilogue warpgroups (BN = 256: warpgroup g copies columns + 128 g): each column
    // must be copied by one of them exactly once.
    let wide = sched("gemm", &[("BN", "256")]);
    let wide_edits: [(&str, Edit, Expect); 3] = [
        // Warpgroup 0's last load also copies warpgroup 1's first 32 columns.
        (
            "column 128 is copied 2 times",
            |s| {
                let extra = copy(s, 128, 32);
                let ops = epilogue(s);
                let last = ops.iter().rposition(|op| matches!(op, Op::TmemLoad { .. }));
                ops.insert(last.expect("a load") + 1, extra);
            },
            |e| matches!(tmem(e), Some(TmemError::Coverage { .. })),
        ),
        // Each warpgroup leaves the last 32 columns of its block behind.
        (
            "column 96 is copied 0 times",
            |s| {
                let last = copy(s, 96, 32);
                without(epilogue(s), last);
            },
            |e| matches!(tmem(e), Some(TmemError::Coverage { .. })),
        ),
        // Six warps: the second warpgroup's lanes 64.. of its block have no reader.
        (
            "every warpgroup of 4 reads all 128 TMEM lanes",
            |s| {
                let r = s.roles.iter_mut().find(|r| r.kind == RoleKind::Epilogue);
                r.expect("the epilogue").warps = 6;
            },
            |e| matches!(tmem(e), Some(TmemError::Lanes(6))),
        ),
    ];
    each_rejected(&wide, &wide_edits);
    // Bias + GELU at BN = 256 copies and reads each 128-column block in four 32-column
    // chunks: no copy after TMEM is handed back, no column read before its copy, every
    // column read once.
    let chunked = sched("gemm_bias_act", &[("BN", "256"), ("act", "2")]);
    let chunked_edits: [(&str, Edit, Expect); 3] = [
        // TMEM handed back once the first chunk has landed: the next tile's mmas would
        // overwrite the columns still to be copied.
        (
            "after arriving on acc_empty",
            |s| {
                let hand_back = [
                    Op::Tcgen05FenceBefore,
                    Op::Arrive {
                        bar: bar(s, "acc_empty"),
                        lag: 0,
                    },
                ];
                let ops = epilogue(s);
                ops.retain(|op| !hand_back.contains(op));
                let first = ops.iter().position(|op| *op == Op::TmemWaitLoad);
                let at = first.expect("a wait") + 1;
                ops.splice(at..at, hand_back);
            },
            |e| matches!(tmem(e), Some(TmemError::LoadAfterHandBack(_))),
        ),
        // The first read takes the second chunk's columns too, before their copy.
        (
            "before a tcgen05.ld copies column 32",
            |s| {
                let first = epilogue(s)
                    .iter_mut()
                    .find(|op| matches!(op, Op::Run(Region::Epilogue(_))));
                *first.expect("a read") = Op::Run(Region::Epilogue(Some((0, 64))));
            },
            |e| matches!(tmem(e), Some(TmemError::ReadBeforeLoad { column: 32, .. })),
        ),
        (
            "column 96 is read 0 times",
            |s| without(epilogue(s), Op::Run(Region::Epilogue(Some((96, 32))))),
            |e| matches!(tmem(e), Some(TmemError::ReadCoverage { column: 96, .. })),
        ),
    ];
    each_rejected(&chunked, &chunked_edits);
    // Through the pass: a diagnostic at the user's loop, not a panic.
    let mut k = scheduled(&ptx_examples::build("gemm", &[]));
    if let Some(s) = k.schedule.sched.as_mut() {
        without(epilogue(s), Op::TmemWaitLoad);
    }
    let d = protocol_check::run(&mut k, Target::Sm100a).expect_err("rejected");
    assert!(d.to_string().contains("tcgen05.wait::ld missing"), "{d}");
    assert!(d.to_string().contains("examples/src/gemm.rs"), "{d}");
}

/// The PTX of `b_col_major` gemm on sm_100a, cut where the roles start: the set-up every
/// thread runs, then the producer's, the MMA warp's and the epilogue's code.
fn roles_ptx(b_col_major: &str) -> [String; 4] {
    let k = ptx_examples::build("gemm", &[("b_col_major", b_col_major)]);
    let m = kiln_ptx::compile(&k, Target::Sm100a).expect("compile");
    assert_eq!(m.threads_per_block, 192);
    let ptx = m.ptx;
    assert!(ptx.contains(".version 8.6\n.target sm_100a\n"));
    assert!(ptx.contains(".maxntid 192, 1, 1"));
    assert!(!ptx.contains("wgmma") && !ptx.contains("setmaxnreg"));
    let cut = |from: &str| ptx.find(from).unwrap_or_else(|| panic!("no `{from}`"));
    let (p, mma, e) = (
        cut("// producer warp:"),
        cut("// mma warp:"),
        cut("// epilogue warps:"),
    );
    assert!(p < mma && mma < e);
    [
        ptx[..p].to_string(),
        ptx[p..mma].to_string(),
        ptx[mma..e].to_string(),
        ptx[e..].to_string(),
    ]
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
fn each_warp_issues_its_own_instructions() {
    for b_col_major in ["false", "true"] {
        let [setup, producer, mma, epilogue] = roles_ptx(b_col_major);
        // Set-up: the MMA warp (warp 5) allocates 128 columns and gives up the permit; the
        // address is published across the ring's bar.sync 0 between the tcgen05 fences.
        assert_eq!(
            count(
                &setup,
                "tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32"
            ),
            1
        );
        assert_eq!(count(&setup, "tcgen05.relinquish_alloc_permit"), 1);
        assert!(
            setup.contains(", 5;\n"),
            "the alloc is guarded by warp == 5"
        );
        let at = |s: &str| setup.find(s).unwrap_or_else(|| panic!("no `{s}`"));
        assert!(at("tcgen05.alloc") < at("tcgen05.fence::before_thread_sync"));
        assert!(at("tcgen05.fence::before_thread_sync") < at("bar.sync 0"));
        assert!(at("bar.sync 0") < at("tcgen05.fence::after_thread_sync"));
        // Producer: TMA loads and their barriers only (A one box, B two), one thread; as on
        // sm_90a a persistent producer writes a tile's first iteration ahead of its loop.
        let boxes = if b_col_major == "true" { 2 } else { 3 };
        assert_eq!(
            count(&producer, "cp.async.bulk.tensor.2d.shared::cluster"),
            2 * boxes
        );
        assert_eq!(count(&producer, "mbarrier.arrive.expect_tx"), 2);
        // Every role walks the work tiles.
        for role in [&producer, &mma, &epilogue] {
            assert!(role.contains("mov.u32 %r") && role.contains("%nctaid.x"));
        }
        assert_eq!(count(&producer, "tcgen05"), 0);
        // MMA warp: one thread issues K/16 = 4 mmas per stage, commits each stage to its
        // empty barrier and the accumulator to acc_full; the warp frees TMEM.
        assert!(
            mma.contains(", 160;\n"),
            "the mmas are issued by thread 160 alone"
        );
        assert_eq!(count(&mma, "tcgen05.mma.cta_group::1.kind::f16"), 4);
        assert_eq!(
            count(&mma, "tcgen05.commit.cta_group::1.mbarrier::arrive::one"),
            2
        );
        assert_eq!(
            count(&mma, "tcgen05.dealloc.cta_group::1.sync.aligned.b32"),
            1
        );
        assert_eq!(count(&mma, "bar.warp.sync"), 1);
        assert_eq!(count(&mma, "cp.async.bulk.tensor"), 0);
        assert_eq!(count(&mma, "tcgen05.ld"), 0);
        // Epilogue: four 32-column copies, one wait before the first use, then the TMA store.
        assert_eq!(
            count(&epilogue, "tcgen05.ld.sync.aligned.32x32b.x32.b32"),
            4
        );
        assert_eq!(count(&epilogue, "tcgen05.wait::ld.sync.aligned"), 1);
        assert_eq!(count(&epilogue, "tcgen05.mma"), 0);
        assert_eq!(count(&epilogue, "tcgen05.alloc"), 0);
        assert_eq!(count(&epilogue, "tcgen05.dealloc"), 0);
        let e = |s: &str| epilogue.find(s).unwrap_or_else(|| panic!("no `{s}`"));
        assert!(e("tcgen05.ld") > e("mbarrier.try_wait"));
        // The warp reconverges after its wait loop: the copies are `.sync.aligned`.
        assert!(e("bar.warp.sync -1") > e("mbarrier.try_wait"));
        assert!(e("bar.warp.sync -1") < e("tcgen05.ld"));
        assert!(epilogue.rfind("tcgen05.ld.").expect("ld") < e("tcgen05.wait::ld"));
        assert!(e("tcgen05.wait::ld") < e("cvt.rn"));
        assert!(e("tcgen05.wait::ld") < e("mbarrier.arrive.shared::cta"));
        assert_eq!(
            count(
                &epilogue,
                "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group"
            ),
            2
        );
    }
}

#[test]
fn other_tile_shapes() {
    // Other stage shapes assemble without spills: BK of 16 and 32 (32- and 64-byte swizzled
    // boxes), 128 (two boxes per stage), BN of 64, a deeper ring.
    for set in [
        &[("BK", "16")][..],
        &[("BK", "32")],
        &[("BK", "128"), ("STAGES", "2")],
        &[("BN", "64"), ("b_col_major", "true")],
        &[("STAGES", "5")],
    ] {
        let k = ptx_examples::build("gemm", set);
        let m = kiln_ptx::compile(&k, Target::Sm100a).unwrap_or_else(|e| panic!("{set:?}: {e}"));
        let report = kiln_ptx::ptxas::check(&m.ptx, Target::Sm100a)
            .unwrap_or_else(|e| panic!("{set:?}: {e}"));
        assert!(!report.spills(), "{set:?}: {report}");
    }
    // A 64-row accumulator does not fill the 128 TMEM lanes: a diagnostic, not a wrong
    // layout.
    let k = ptx_examples::build("gemm", &[("BM", "64")]);
    let err = kiln_ptx::compile(&k, Target::Sm100a).expect_err("rejected");
    assert!(
        err.to_string().contains("not implemented yet"),
        "BM = 64: {err}"
    );
}

#[test]
fn f16_and_fused_epilogues() {
    // f16: the instruction descriptor's A and B type codes are 0 (bf16: 1, bits 7 and 10).
    let k = scheduled(&ptx_examples::build("gemm", &[("dtype", "f16")]));
    let s = k.schedule.sched.expect("a schedule");
    assert_eq!(mainloop_mma(&s).idesc, 0x0821_0010);
    // The fused epilogues of `gemm_epilogue.rs` run after the copy out of TMEM, on the
    // epilogue warps, in the accumulator's row-per-thread layout. The copy-convert-store of
    // the gemm keeps whole rows on one warpgroup; a bias row beside the accumulator, or an
    // activation's temporaries, would be more than a thread should hold, so two warpgroups
    // take half a row each (warp w: TMEM lanes 32 (w % 4), columns (w / 4) 64 ..), gelu's
    // and silu's in two 32-column chunks. Every one assembles without spills.
    for (kernel, set, warps) in [
        ("gemm", &[("dtype", "f16")][..], 4),
        ("gemm_bias_act", &[], 8),
        ("gemm_bias_act", &[("act", "1")], 8),
        ("gemm_bias_act", &[("act", "2")], 8),
        ("gemm_bias_act", &[("act", "3")], 8),
        ("gemm_bias_act", &[("act", "3"), ("b_col_major", "true")], 8),
        ("gemm_alpha_beta", &[], 8),
    ] {
        let (s, m) = epilogue_ptx(kernel, set);
        let epilogue_warps = s.role(RoleKind::Epilogue).expect("epilogue").warps;
        assert_eq!(epilogue_warps, warps, "{kernel} {set:?}");
        let epilogue = &m.ptx[m.ptx.find("// epilogue warps:").expect("epilogue")..];
        assert_eq!(
            count(epilogue, "tcgen05.ld.sync.aligned.32x32b.x32.b32"),
            16 / warps as usize
        );
        assert_eq!(count(&m.ptx, "tcgen05.mma.cta_group::1.kind::f16"), 4);
    }
}

/// The schedule IR and PTX of `kernel` on sm_100a, which ptxas assembles without spills.
fn epilogue_ptx(kernel: &str, set: &[(&str, &str)]) -> (Sched, kiln_ptx::PtxModule) {
    let k = ptx_examples::build(kernel, set);
    let plan = scheduled(&k).schedule.sched.expect("a schedule");
    let m = kiln_ptx::compile(&k, Target::Sm100a).unwrap_or_else(|e| panic!("{kernel}: {e}"));
    let report =
        kiln_ptx::ptxas::check(&m.ptx, Target::Sm100a).unwrap_or_else(|e| panic!("{kernel}: {e}"));
    assert!(!report.spills(), "{kernel} {set:?}: {report}");
    (plan, m)
}

#[test]
fn a_256_column_accumulator_takes_two_warpgroups() {
    // BN = 256: a 128 x 256 tile, 256 TMEM columns; each epilogue thread copies half its row
    // (128 columns, four x32 loads) and the TMA store stages the whole tile, each warpgroup
    // its own two boxes. Beside the half row, a bias row, an activation's temporaries or
    // alpha/beta's `c` would not fit the 168 registers a 320-thread block leaves each thread
    // (a quarter of the 10 warps, rounded up, shares a 16K-register SM sub-partition; ptxas
    // 13.5 spilled relu 12 B, alpha/beta 8 B, gelu and silu about 920 B when each thread held
    // its whole half row), so those threads hold it in chunks (`chunk` columns): each chunk
    // is copied, waited for, computed (its own bias values loaded) and written to the staging
    // tile before the next is copied, and TMEM goes back once the last chunk has landed.
    // Every one assembles without spills.
    for (kernel, set, chunk) in [
        ("gemm", &[("BN", "256")][..], 128),
        ("gemm", &[("BN", "256"), ("b_col_major", "true")], 128),
        ("gemm_bias_act", &[("BN", "256")], 64),
        ("gemm_bias_act", &[("BN", "256"), ("act", "1")], 64),
        ("gemm_bias_act", &[("BN", "256"), ("act", "2")], 32),
        ("gemm_bias_act", &[("BN", "256"), ("act", "3")], 32),
        ("gemm_alpha_beta", &[("BN", "256")], 64),
    ] {
        let (mut s, m) = epilogue_ptx(kernel, set);
        let (columns, acc_tile) = acc(&s);
        assert_eq!((columns, acc_tile.columns), (256, 256), "{kernel}");
        assert_eq!(mainloop_mma(&s).idesc >> 17 & 0x3f, 256 >> 3);
        assert_eq!(warps(&s), (8, 8, 9, 320));
        assert_eq!(m.threads_per_block, 320);
        // Each warpgroup's block: the first 128 columns, from its own offset.
        let block = epilogue(&mut s)
            .iter()
            .filter_map(|op| match *op {
                Op::TmemLoad {
                    column, columns, ..
                } => Some(column + columns),
                _ => None,
            })
            .max();
        assert_eq!(block, Some(128), "{kernel} {set:?}");
        let reads: Vec<(u32, u32)> = epilogue(&mut s)
            .iter()
            .filter_map(|op| match *op {
                Op::Run(Region::Epilogue(Some(read))) => Some(read),
                _ => None,
            })
            .collect();
        let chunks: Vec<(u32, u32)> = (0..128).step_by(chunk).map(|c| (c, chunk as u32)).collect();
        assert_eq!(reads, chunks, "{kernel} {set:?}");
        let epilogue = &m.ptx[m.ptx.find("// epilogue warps:").expect("epilogue")..];
        assert_eq!(count(epilogue, "tcgen05.ld.sync.aligned.32x32b.x32.b32"), 4);
        assert_eq!(
            count(epilogue, "tcgen05.wait::ld.sync.aligned"),
            128 / chunk,
            "{kernel} {set:?}: one wait per chunk"
        );
        let at = |s: &str| epilogue.find(s).unwrap_or_else(|| panic!("no `{s}`"));
        assert!(epilogue.rfind("tcgen05.ld.").expect("ld") < at("mbarrier.arrive.shared::cta"));
        if kernel == "gemm_bias_act" {
            // Each chunk loads its own bias values, after its copy has landed: 16-byte
            // vectors of eight, once where the warp's columns all lie inside the tensor and
            // once (predicated) on the edge.
            let chunk_code = &epilogue[at("tcgen05.wait::ld")..];
            let next = chunk_code[1..]
                .find("tcgen05.ld.")
                .map_or(chunk_code.len(), |i| i + 1);
            assert_eq!(
                count(&chunk_code[..next], "ld.global.nc.v4.b32"),
                2 * chunk / 8
            );
        }
        assert!(
            m.ptx
                .contains("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32")
        );
        assert!(m.ptx.contains("], 256;\n"), "256 columns allocated");
        // The 256 epilogue threads meet at the store's named barrier: once before the first
        // chunk writes the staging tile, once after the last (then one thread stores it).
        assert_eq!(count(epilogue, "bar.sync 1, 256"), 2, "{kernel} {set:?}");
        assert_eq!(count(epilogue, "cp.async.bulk.wait_group.read 0"), 1);
        assert_eq!(
            count(
                epilogue,
                "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group"
            ),
            4
        );
    }
}
