//! The sm_90a schedules of the example gemm (B row- and column-major) and attention (Q once,
//! K and V per stage): the `pipeline` pass plans one TMA ring that the
//! `protocol_check` pass accepts, and a deliberately broken copy of that real schedule is
//! rejected with a diagnostic at the user's loop; kernels sm_90a does not schedule yet get a
//! diagnostic, not a panic.

mod ptx_examples;
mod softcap;

use kiln_ir::dsl::KernelDef;
use kiln_ir::passes::{PASSES, occupancy, protocol_check, warp_specialise};
use kiln_ir::sched::tiles::TileScheduler;
use kiln_ir::sched::tma::Operand;
use kiln_ir::sched::{
    BarrierId, Index, LoadId, MmaPart, Op, Program, Region, RoleKind, Sched, Who,
};
use kiln_ir::{Kernel, Target};

/// A deliberate break of a schedule's protocol.
type Edit = fn(&mut Sched);

/// The schedule IR of a scheduled kernel.
fn sched(k: &Kernel) -> &Sched {
    k.schedule.sched.as_ref().expect("a schedule")
}

/// The schedule IR of a scheduled kernel, to break.
fn sched_mut(k: &mut Kernel) -> &mut Sched {
    k.schedule.sched.as_mut().expect("a schedule")
}

/// The program of `s`'s role of `kind`.
fn program(s: &mut Sched, kind: RoleKind) -> &mut Program {
    &mut s
        .roles
        .iter_mut()
        .find(|r| r.kind == kind)
        .expect("the role")
        .program
}

/// `(warps, setmaxnreg)` of `s`'s role of `kind`.
fn warps_regs(s: &Sched, kind: RoleKind) -> (u32, u32) {
    let r = s.role(kind).expect("the role");
    (r.warps, r.regs.unwrap_or(0))
}

/// The barrier of `s` called `name`.
fn bar(s: &Sched, name: &str) -> BarrierId {
    s.barriers
        .iter()
        .find(|(_, b)| b.name == name)
        .map(|(h, _)| h)
        .unwrap_or_else(|| panic!("no barrier {name}"))
}

/// The count of mbarrier `name`.
fn count(s: &Sched, name: &str) -> u32 {
    s.mbarrier(bar(s, name)).map_or(0, |m| m.count)
}

/// Ring load `i` of `s` (the ring's loads come first).
fn load(s: &Sched, i: usize) -> &kiln_ir::sched::tma::TmaLoad {
    &s.loads[LoadId::from_index(i)].tma
}

/// `kernel` after every pass but `protocol_check`, for sm_90a.
fn scheduled(kernel: &Kernel) -> Kernel {
    let mut k = kernel.clone();
    for (name, _, pass) in PASSES {
        if *name != "protocol_check" {
            pass(&mut k, Target::Sm90a).unwrap_or_else(|d| panic!("{name}: {d}"));
        }
    }
    k
}

#[test]
fn gemm_ring_is_planned_and_proved() {
    // B row-major is an MN-major operand (boxes of 64 N-columns x BK rows); column-major B
    // (`b: [N, K]`, read as `y.t()`) is K-major like A: one box of 64 K-columns x BN rows.
    for (b_col_major, operand, b_box) in [
        ("false", Operand::MnMajorB, [64, 64]),
        ("true", Operand::KMajorB, [128, 64]),
    ] {
        let mut k = scheduled(&ptx_examples::build(
            "gemm",
            &[("b_col_major", b_col_major)],
        ));
        let s = sched(&k);
        assert_eq!((s.stages, count(s, "full"), count(s, "empty")), (3, 1, 8));
        let a = load(s, 0);
        assert_eq!(
            (a.operand, a.box_dims, a.swizzle),
            (Operand::KMajorA, [128, 64], 128)
        );
        let b = load(s, 1);
        assert_eq!((b.operand, b.box_dims, b.swizzle), (operand, b_box, 128));
        assert_eq!(b.tile_bytes(), 128 * 64 * 2);
        assert_eq!(s.threads(), 384);
        protocol_check::run(&mut k, Target::Sm90a).expect("the planned protocol is sound");
    }
}

/// What the schedule of a gemm tile of `bm` rows must be: one consumer warpgroup per 64 rows.
struct GemmTile {
    bm: &'static str,
    consumer_warps: u32,
    threads: u32,
    /// CTAs per multiprocessor, producer and consumer registers.
    split: (u32, u32, u32),
    /// The TMA box of A's stage (`empty` gets one arrival per consumer warp).
    a_box: [u32; 2],
    /// Threads meeting at the TMA store: one warpgroup's, each storing its own rows.
    store_threads: u32,
    /// A line the PTX must have.
    ptx: &'static str,
}

#[test]
fn gemm_tiles_get_a_consumer_warpgroup_per_64_rows() {
    let tiles = [
        // The small-M tile: two CTAs share a multiprocessor (2 x 89 KB of shared memory, 128
        // registers each at entry, the producer's given back to the consumer: 24 + 232).
        GemmTile {
            bm: "64",
            consumer_warps: 4,
            threads: 256,
            split: (2, 24, 232),
            a_box: [64, 64],
            store_threads: 128,
            ptx: ".minnctapersm 2",
        },
        // Three warpgroups: what the 64K registers leave them, 40 / 152.
        GemmTile {
            bm: "192",
            consumer_warps: 12,
            threads: 512,
            split: (1, 40, 152),
            a_box: [192, 64],
            store_threads: 128,
            ptx: "setmaxnreg.inc.sync.aligned.u32 152;",
        },
    ];
    for t in tiles {
        for b_col_major in ["false", "true"] {
            let overrides = [("BM", t.bm), ("b_col_major", b_col_major)];
            let kernel = ptx_examples::build("gemm", &overrides);
            let mut k = scheduled(&kernel);
            let s = sched(&k);
            let (consumer_warps, consumer_regs) = warps_regs(s, RoleKind::Consumer);
            assert_eq!(
                (consumer_warps, s.threads()),
                (t.consumer_warps, t.threads),
                "{overrides:?}"
            );
            let producer_regs = warps_regs(s, RoleKind::Producer).1;
            assert_eq!(
                (s.ctas_per_sm, producer_regs, consumer_regs),
                t.split,
                "{overrides:?}"
            );
            assert_eq!(
                (load(s, 0).box_dims, count(s, "empty")),
                (t.a_box, t.consumer_warps),
                "{overrides:?}"
            );
            // Each consumer warpgroup stores its own 64 rows.
            let st = s.stores.first().expect("a TMA store");
            assert_eq!(
                (st.threads, st.groups),
                (t.store_threads, t.consumer_warps / 4),
                "{overrides:?}"
            );
            protocol_check::run(&mut k, Target::Sm90a).expect("the planned protocol is sound");
            let m = kiln_ptx::compile(&kernel, Target::Sm90a).expect("compile");
            assert_eq!(m.threads_per_block, t.threads, "{overrides:?}");
            assert!(
                m.ptx.contains("wgmma.mma_async.sync.aligned.m64n128k16"),
                "{overrides:?}"
            );
            assert!(m.ptx.contains(t.ptx), "{overrides:?}: {}", t.ptx);
            let report = kiln_ptx::ptxas::check(&m.ptx, Target::Sm90a).expect("ptxas");
            assert!(
                !report.spills()
                    && report.warnings.is_empty()
                    && report.registers <= 65536 / t.threads / t.split.0,
                "{overrides:?}: {report}"
            );
        }
    }
    // A 64-row tile whose stages take more than half the shared memory keeps the
    // multiprocessor to itself.
    let k = scheduled(&ptx_examples::build("gemm", &[("BM", "64"), ("BN", "256")]));
    let s = sched(&k);
    assert_eq!(
        (
            s.ctas_per_sm,
            warps_regs(s, RoleKind::Producer).1,
            warps_regs(s, RoleKind::Consumer).1
        ),
        (1, 40, 232)
    );
}

/// Attention at d = 64 with 192-row query blocks (FlashAttention-3's): three consumer
/// warpgroups of four warps and the producer's, 512 threads at 24 / 160 registers, every
/// consumer warp arriving on `empty`, the O store through TMA by each warpgroup alone, and
/// the warpgroups taking turns in the fixed order 0, 1, 2 on three named barriers of two
/// warpgroups (256 threads) each, the last handing the leader its first turn; ptxas places it
/// without spills or advisories.
#[test]
fn attention_of_192_rows_runs_three_consumer_warpgroups_in_turns() {
    for causal in ["false", "true"] {
        let overrides = [("d", "64"), ("block_m", "192"), ("causal", causal)];
        let kernel = ptx_examples::build("attention", &overrides);
        let mut k = scheduled(&kernel);
        let s = sched(&k);
        let (consumer_warps, consumer_regs) = warps_regs(s, RoleKind::Consumer);
        assert_eq!((consumer_warps, s.threads()), (12, 512));
        assert_eq!(
            (
                s.ctas_per_sm,
                warps_regs(s, RoleKind::Producer).1,
                consumer_regs
            ),
            (1, 24, 160)
        );
        let q = s
            .loads
            .iter()
            .find(|(h, _)| s.once(*h))
            .map(|(_, l)| l.tma.box_dims);
        assert_eq!((q, count(s, "empty")), (Some([192, 64]), 12));
        let o = s.overlap.as_ref().expect("rotated");
        let turns = o.turns.expect("three warpgroups take turns");
        assert_eq!((turns.warpgroups, turns.first_barrier), (3, 1));
        // Once per CTA: the turns go round across its tiles.
        let turn = bar(s, "turn");
        let consumer = &s.role(RoleKind::Consumer).expect("consumers").program;
        assert_eq!(
            consumer.start,
            [Op::Signal {
                bar: turn,
                index: Index::Next,
                who: Who::Last
            }]
        );
        assert_eq!(
            consumer.exit,
            [
                Op::Sync {
                    bar: turn,
                    index: Index::Own,
                    who: Who::Leader
                },
                Op::BulkWaitAll
            ]
        );
        assert!(consumer.drain.is_empty());
        let st = s.stores.first().expect("a TMA store");
        let first = match s.barriers[st.barrier].kind {
            kiln_ir::sched::BarrierKind::Named { first, .. } => first,
            kiln_ir::sched::BarrierKind::Mbarrier(_) => 0,
        };
        assert_eq!((st.threads, st.groups, first), (128, 3, 4));
        protocol_check::run(&mut k, Target::Sm90a).expect("the planned protocol is sound");
        // Every warpgroup handing a turn on at the start (several turns going round) is a
        // compiler error at the user's loop.
        let mut broken = scheduled(&kernel);
        let s = sched_mut(&mut broken);
        let turn = bar(s, "turn");
        program(s, RoleKind::Consumer).start = vec![Op::Signal {
            bar: turn,
            index: Index::Next,
            who: Who::All,
        }];
        let d = protocol_check::run(&mut broken, Target::Sm90a).expect_err("several turns");
        let text = d.to_string();
        assert!(text.contains("broken ping-pong order"), "{text}");
        assert!(text.contains("examples/src/attention.rs"), "{text}");

        let m = kiln_ptx::compile(&kernel, Target::Sm90a).expect("compile");
        assert_eq!(m.threads_per_block, 512);
        for line in [
            // Threads 0..384 consume; the producer warpgroup gives its registers back.
            "setp.lt.u32 %p1, %r0, 384;",
            "setmaxnreg.dec.sync.aligned.u32 24;",
            "setmaxnreg.inc.sync.aligned.u32 160;",
            "wgmma.mma_async.sync.aligned.m64n128k16",
        ] {
            assert!(m.ptx.contains(line), "{overrides:?}: no `{line}`");
        }
        // Each warpgroup meets at the O store's barrier 4 + its index alone, after the turns.
        let store_sync = m
            .ptx
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with("bar.sync %r") && l.ends_with(", 128;"))
            .count();
        assert!(
            store_sync == 2 && !m.ptx.contains("bar.sync 4, 384;"),
            "{overrides:?}: the store's syncs"
        );
        // Warpgroup g (`wg`) waits on barrier 1 + g and hands on to 1 + (g + 1) % 3; the last
        // (g = 2) hands the leader its first turn; every turn barrier joins two warpgroups.
        let lines: Vec<&str> = m.ptx.lines().map(str::trim).collect();
        let rem = lines
            .iter()
            .position(|l| l.starts_with("rem.u32 ") && l.ends_with(", 3;"))
            .unwrap_or_else(|| panic!("{overrides:?}: no turn order modulo 3"));
        let order = &lines[rem - 2..rem + 4];
        let wg = order[0]
            .strip_prefix("add.u32 ")
            .and_then(|l| l.split(", ").nth(1))
            .expect("the own barrier from the warpgroup");
        let reg = |l: &str| {
            l.split([' ', ','])
                .nth(1)
                .expect("a destination")
                .to_string()
        };
        let (own_r, next_r) = (reg(order[0]), reg(order[1]));
        assert_eq!(
            order,
            [
                format!("add.u32 {own_r}, {wg}, 1;"),
                format!("add.u32 {next_r}, {wg}, 1;"),
                format!("rem.u32 {next_r}, {next_r}, 3;"),
                format!("add.u32 {next_r}, {next_r}, 1;"),
                order[4].to_string(),
                order[5].to_string(),
            ],
            "{overrides:?}"
        );
        assert!(order[4].starts_with("setp.eq.u32") && order[4].ends_with(&format!("{wg}, 0;")));
        assert!(order[5].starts_with("setp.ne.u32") && order[5].ends_with(&format!("{wg}, 2;")));
        let turns: Vec<&str> = lines
            .iter()
            .copied()
            .filter(|l| l.starts_with("bar.sync %") || l.starts_with("bar.arrive %"))
            .filter(|l| !l.ends_with(", 128;"))
            .collect();
        assert!(
            !turns.is_empty()
                && turns.iter().all(|l| {
                    *l == format!("bar.sync {own_r}, 256;")
                        || *l == format!("bar.arrive {next_r}, 256;")
                }),
            "{overrides:?}: {turns:?}"
        );
        let report = kiln_ptx::ptxas::check(&m.ptx, Target::Sm90a).expect("ptxas");
        assert!(
            !report.spills() && report.warnings.is_empty() && report.registers <= 160,
            "{overrides:?}: {report}"
        );
    }
}

/// Two CTAs per multiprocessor get only the registers their warps hold from launch: 128 a
/// thread for 256 threads, 80 for 384. A 64-row gemm tile (one consumer warpgroup) runs two at
/// 24 / 232. Two consumer warpgroups would get 24 / 104, short of what attention at d = 64
/// with 64-key blocks needs (112; it hung in `setmaxnreg.inc` on the H200 when planned at
/// 112), so it keeps the multiprocessor to itself, as do wider tiles; a split the launch
/// registers cannot hold is a compiler error at the user's loop.
#[test]
fn two_ctas_per_multiprocessor_only_where_the_launch_registers_hold_the_split() {
    assert_eq!(occupancy::shared_split(4, 4), 232);
    assert_eq!(occupancy::shared_split(8, 4), 104);
    let k = scheduled(&ptx_examples::build("gemm", &[("BM", "64")]));
    let s = sched(&k);
    assert_eq!(
        (
            s.ctas_per_sm,
            warps_regs(s, RoleKind::Producer).1,
            warps_regs(s, RoleKind::Consumer).1
        ),
        (2, 24, 232)
    );
    for (name, overrides) in [
        ("attention", vec![("d", "64"), ("block_n", "64")]),
        (
            "attention",
            vec![("d", "64"), ("block_n", "64"), ("causal", "true")],
        ),
        ("attention", vec![("d", "64"), ("block_n", "128")]),
        ("attention", vec![("d", "128"), ("block_n", "64")]),
        ("gemm", vec![("BK", "32"), ("STAGES", "3")]),
    ] {
        let mut k = scheduled(&ptx_examples::build(name, &overrides));
        assert_eq!(sched(&k).ctas_per_sm, 1, "{name} {overrides:?}");
        warp_specialise::check_register_file(&k).expect("the split fits");
        let s = sched_mut(&mut k);
        s.ctas_per_sm = 2;
        for r in &mut s.roles {
            r.regs = Some(if r.kind == RoleKind::Producer {
                24
            } else {
                112
            });
        }
        let text = warp_specialise::check_register_file(&k)
            .expect_err("24 / 112 for 384 threads at two CTAs")
            .to_string();
        assert!(text.contains("holds 30720"), "{text}");
        assert!(text.contains(&format!("examples/src/{name}.rs")), "{text}");
    }
}

/// Consumers whose accumulators do not fit their registers are a compiler error at the user's
/// loop, before ptxas would spill or refuse them (C7602): three consumer warpgroups of
/// attention at d = 256 (O alone is 128 registers a thread) or of a 192 x 256 gemm tile.
/// Their neighbours that fit compile.
#[test]
fn accumulators_that_do_not_fit_the_consumers_are_compiler_errors() {
    for (name, overrides, fits) in [
        ("attention", vec![("d", "256"), ("block_m", "192")], false),
        ("gemm", vec![("BM", "192"), ("BN", "256")], false),
        ("attention", vec![("d", "64"), ("block_m", "192")], true),
        ("gemm", vec![("BM", "192"), ("BN", "128")], true),
    ] {
        let kernel = ptx_examples::build(name, &overrides);
        let result = kiln_ptx::compile(&kernel, Target::Sm90a);
        if fits {
            result.unwrap_or_else(|e| panic!("{name} {overrides:?}: {e}"));
            continue;
        }
        let text = result.expect_err("the consumers do not fit").to_string();
        assert!(
            text.contains("3 consumer warpgroup(s) of a 512-thread block"),
            "{text}"
        );
        assert!(text.contains(&format!("examples/src/{name}.rs")), "{text}");
    }
}

#[test]
fn broken_real_schedules_are_compiler_errors() {
    let edits: [(&str, Edit); 3] = [
        ("deadlock", |s| {
            program(s, RoleKind::Consumer)
                .iteration
                .retain(|op| !matches!(op, Op::Arrive { .. }))
        }),
        ("transaction bytes", |s| {
            for op in &mut program(s, RoleKind::Producer).iteration {
                if let Op::ExpectTx { bytes, .. } = op {
                    *bytes += 16;
                }
            }
        }),
        ("must start at 1", |s| {
            let empty = bar(s, "empty");
            program(s, RoleKind::Producer).iteration[0] = Op::Wait {
                bar: empty,
                start: 0,
                lag: 0,
            }
        }),
    ];
    for (expect, edit) in edits {
        for b_col_major in ["false", "true"] {
            let mut k = scheduled(&ptx_examples::build(
                "gemm",
                &[("b_col_major", b_col_major)],
            ));
            edit(sched_mut(&mut k));
            let d = protocol_check::run(&mut k, Target::Sm90a).expect_err(expect);
            let text = d.to_string();
            assert!(text.contains(expect), "{expect}: {text}");
            assert!(text.contains("examples/src/gemm.rs"), "{text}");
        }
    }
}

/// The attention variants the snapshots cover.
const ATTENTION: [&[(&str, &str)]; 3] = [&[], &[("causal", "true")], &[("d", "64")]];

#[test]
fn attention_ring_is_planned_and_proved() {
    for overrides in ATTENTION {
        let mut k = scheduled(&ptx_examples::build("attention", overrides));
        let s = sched(&k);
        // The kernel asks for 2 stages; the rotated loop holds one more (the tail's).
        assert_eq!((s.stages, count(s, "full"), count(s, "empty")), (3, 1, 8));
        // K (`[bn, d]`, read as `ks.t()`: K-major B) and V (`[bn, d]`: MN-major B) per stage;
        // Q (`[128, d]`, K-major A) once, all rank-4 tensors (batch and head as lead dims).
        let operands: Vec<Operand> = s.ring_loads().map(|(_, l)| l.tma.operand).collect();
        assert_eq!(
            operands,
            [Operand::KMajorB, Operand::MnMajorB],
            "{overrides:?}"
        );
        let once: Vec<Operand> = s
            .loads
            .iter()
            .filter(|(h, _)| s.once(*h))
            .map(|(_, l)| l.tma.operand)
            .collect();
        assert_eq!(once, [Operand::KMajorA]);
        assert!(
            s.loads.iter().all(|(_, l)| l.tma.lead_dims == 2),
            "{overrides:?}"
        );
        // The overlap pass found S = Q K^T -> softmax -> O += P V by structure: the loop is
        // rotated (head of block t, tail of block t - 1, the head waited for with one group
        // in flight, the previous stage released after the tail), and the two consumer
        // warpgroups take turns.
        let o = s.overlap.as_ref().expect("the loop is rotated");
        // The online softmax and its normalisation by l: the maximum's growth is deferred.
        let d = o.defer.expect("a deferrable maximum");
        assert!(o.rescale.is_some());
        assert!(k.ops[d.max].kind == kiln_ir::OpKind::Binary(kiln_ir::BinaryOp::Max));
        let turns = o.turns.expect("two warpgroups ping-pong");
        assert_eq!((turns.warpgroups, turns.first_barrier), (2, 1));
        assert_eq!(o.carried, 0, "the accumulator is the first carried value");
        let consumer = &s.role(RoleKind::Consumer).expect("consumers").program;
        let at = |op: Op| consumer.iteration.iter().position(|&x| x == op);
        assert!(at(Op::Wgmma(MmaPart::Head)) < at(Op::Wgmma(MmaPart::Tail)));
        assert!(at(Op::Wgmma(MmaPart::Tail)) < at(Op::WgmmaWait(1)));
        assert!(at(Op::WgmmaWait(1)) < at(Op::Run(Region::Between)));
        assert!(at(Op::Run(Region::Between)) < at(Op::WgmmaWait(0)));
        assert!(consumer.iteration.contains(&Op::Arrive {
            bar: bar(s, "empty"),
            lag: 1
        }));
        assert_eq!(s.threads(), 384);
        assert_eq!(
            (
                warps_regs(s, RoleKind::Producer).1,
                warps_regs(s, RoleKind::Consumer).1
            ),
            (24, 240)
        );
        protocol_check::run(&mut k, Target::Sm90a).expect("the planned protocol is sound");
    }
}

#[test]
fn attention_ring_without_room_for_a_stage_is_split() {
    // d = 256: Q (64 KiB) and two stages of K and V (64 KiB each) leave no room for a third;
    // V, which only the tail reads, gets its own barriers and K is released after the head.
    for causal in ["false", "true"] {
        let mut k = scheduled(&ptx_examples::build(
            "attention",
            &[("d", "256"), ("causal", causal)],
        ));
        let s = sched(&k);
        let o = s.overlap.as_ref().expect("the loop is rotated");
        assert_eq!((s.stages, o.deepened), (2, false));
        let tail_full = bar(s, "tail_full");
        let on_tail: Vec<usize> = s
            .ring_loads()
            .enumerate()
            .filter(|(_, (_, l))| l.barrier == tail_full)
            .map(|(i, _)| i)
            .collect();
        assert_eq!(on_tail, [1], "V is the tail's load");
        let consumer = &s.role(RoleKind::Consumer).expect("consumers").program;
        let at = |op: Op| consumer.iteration.iter().position(|&x| x == op);
        let k_release = at(Op::Arrive {
            bar: bar(s, "empty"),
            lag: 0,
        });
        let v_release = at(Op::Arrive {
            bar: bar(s, "tail_empty"),
            lag: 1,
        });
        assert!(at(Op::WgmmaWait(1)) < k_release && k_release < at(Op::Run(Region::Between)));
        assert!(at(Op::WgmmaWait(0)) < v_release);
        assert!(
            at(Op::Wait {
                bar: tail_full,
                start: 0,
                lag: 0
            }) < at(Op::Run(Region::Handoff))
        );
        protocol_check::run(&mut k, Target::Sm90a).expect("the split protocol is sound");
    }
    // Where the third stage fits (d = 128), the ring is not split.
    let k = scheduled(&ptx_examples::build("attention", &[]));
    let s = sched(&k);
    let split = s.barriers.iter().any(|(_, b)| b.name == "tail_full");
    assert!(!split && s.stages == 3);
}

#[test]
fn attention_is_persistent_with_the_tile_order_its_trip_count_needs() {
    for (causal, order) in [
        ("false", TileScheduler::Strided),
        ("true", TileScheduler::LongestFirst),
    ] {
        let kernel = ptx_examples::build("attention", &[("causal", causal)]);
        let k = scheduled(&kernel);
        let s = sched(&k);
        assert_eq!(s.tiles, Some(order), "causal={causal}");
        let once_free = bar(s, "once_free");
        let role = |kind| &s.role(kind).expect("the role").program;
        assert_eq!(
            role(RoleKind::Producer).tile[0],
            Op::Wait {
                bar: once_free,
                start: 1,
                lag: 0
            }
        );
        assert_eq!(
            role(RoleKind::Consumer).release,
            [Op::Arrive {
                bar: once_free,
                lag: 0
            }]
        );
        let m = kiln_ptx::compile(&kernel, Target::Sm90a).expect("compile");
        assert!(m.persistent && m.ptx.contains(".param .s32 kiln_grid_z"));
        // The roles split once, at the start; each walks the tiles.
        assert_eq!(m.ptx.matches("setmaxnreg.dec").count(), 1);
        assert_eq!(m.ptx.matches("setmaxnreg.inc").count(), 1);
        assert_eq!(
            m.ptx.matches("%ctaid.x").count(),
            2,
            "one tile walk per role"
        );
    }
    // An unrotated ring (the gemm's) too, its tiles all alike; `a` is reused along y and `b`
    // along x, so they run in groups.
    let k = scheduled(&ptx_examples::build("gemm", &[]));
    assert_eq!(sched(&k).tiles, Some(TileScheduler::Grouped { rows: 8 }));
}

#[test]
fn attention_tensor_maps_are_rank_4_boxes() {
    // (overrides, key block): d = 128 walks 64 keys per block, d = 64 128.
    for (overrides, bn) in [(ATTENTION[0], 64), (ATTENTION[2], 128)] {
        let m = kiln_ptx::compile(&ptx_examples::build("attention", overrides), Target::Sm90a)
            .expect("compile");
        let maps: Vec<(usize, Vec<u32>, u32)> = m
            .tensor_maps
            .iter()
            .map(|t| (t.param, t.box_dims.clone(), t.swizzle_bytes))
            .collect();
        // q, k, v: batch and head boxes of 1, 64 head-dim columns per box, 128-B swizzle; o
        // (stored through TMA) the same, 64 query rows: each consumer warpgroup stores its own.
        assert_eq!(
            maps,
            [
                (0, vec![1, 1, 128, 64], 128),
                (1, vec![1, 1, bn, 64], 128),
                (2, vec![1, 1, bn, 64], 128),
                (3, vec![1, 1, 64, 64], 128),
            ],
            "{overrides:?}"
        );
        assert!(m.ptx.contains("cp.async.bulk.tensor.4d"), "{overrides:?}");
    }
}

/// A TMA-store case: kernel, overrides, boxes of 64 columns, rounds, the ring's stages, split.
type StoreCase = (
    &'static str,
    &'static [(&'static str, &'static str)],
    usize,
    u32,
    u32,
    bool,
);

#[test]
fn epilogue_stores_go_through_a_staging_tile_and_tma() {
    let cases: [StoreCase; 6] = [
        ("gemm", &[], 2, 1, 3, false),
        ("gemm", &[("BN", "256")], 4, 1, 3, false),
        // 4 stages of 48 KB leave room for half the 64 KB tile: two rounds.
        ("gemm", &[("BN", "256"), ("STAGES", "4")], 4, 2, 4, false),
        ("attention", &[("d", "64")], 1, 1, 3, false),
        // The third stage of d = 128 with 128-key blocks gives way to the staging tile: the
        // ring is split instead.
        ("attention", &[("block_n", "128")], 2, 1, 2, true),
        // d = 256 (Q 64 KB, two 64 KB stages): half its 64 KB output at a time.
        ("attention", &[("d", "256")], 4, 2, 2, true),
    ];
    for (name, overrides, boxes, rounds, stages, split) in cases {
        let kernel = ptx_examples::build(name, overrides);
        let k = scheduled(&kernel);
        let s = sched(&k);
        let [st] = &s.stores[..] else {
            panic!("{name} {overrides:?}: one TMA store");
        };
        let is_split = s.barriers.iter().any(|(_, b)| b.name == "tail_full");
        assert_eq!(
            (st.boxes.len(), st.rounds, s.stages, is_split),
            (boxes, rounds, stages, split),
            "{name} {overrides:?}"
        );
        assert!(st.offset.is_multiple_of(1024) && st.offset + st.bytes() <= k.schedule.smem_bytes);
        let m = kiln_ptx::compile(&kernel, Target::Sm90a).expect("compile");
        let issued = m.ptx.matches(".global.shared::cta.bulk_group").count();
        assert_eq!(
            issued, boxes,
            "{name} {overrides:?}: one bulk store per box"
        );
        // Per round: wait until the last store read the staging tile, write, fence, issue.
        for (needed, count) in [
            ("cp.async.bulk.wait_group.read 0", rounds),
            ("fence.proxy.async.shared::cta", rounds),
            ("cp.async.bulk.commit_group", rounds),
            ("cp.async.bulk.wait_group 0", 1),
        ] {
            assert_eq!(
                m.ptx.matches(needed).count() as u32,
                count,
                "{name} {overrides:?}: {needed}"
            );
        }
        assert!(
            !m.ptx.contains("st.global"),
            "{name} {overrides:?}: no register stores"
        );
    }
}

#[test]
fn broken_attention_schedules_are_compiler_errors() {
    let edits: [(&str, Edit); 8] = [
        ("without waiting on `once`", |s| {
            program(s, RoleKind::Consumer)
                .tile
                .retain(|op| !matches!(op, Op::Wait { .. }))
        }),
        ("on `once`", |s| {
            for op in &mut program(s, RoleKind::Producer).tile {
                if let Op::ExpectTx { bytes, .. } = op {
                    *bytes -= 1024;
                }
            }
        }),
        ("before the wgmma reading it has completed", |s| {
            for op in &mut program(s, RoleKind::Consumer).iteration {
                if *op == Op::WgmmaWait(0) {
                    *op = Op::WgmmaWait(1);
                }
            }
        }),
        // A missing wait: the softmax reads S while its wgmma may still run.
        ("reads the head mma's products", |s| {
            program(s, RoleKind::Consumer)
                .iteration
                .retain(|op| *op != Op::WgmmaWait(1))
        }),
        // The softmax moved before the wait for S.
        ("reads the head mma's products", |s| {
            let it = &mut program(s, RoleKind::Consumer).iteration;
            let between = it.iter().position(|op| *op == Op::Run(Region::Between));
            let wait = it.iter().position(|op| *op == Op::WgmmaWait(1));
            if let (Some(b), Some(w)) = (between, wait) {
                it.swap(b, w);
            }
        }),
        // Broken ping-pong orders: no first turn for the leader; a turn passed twice.
        ("deadlock", |s| program(s, RoleKind::Consumer).start.clear()),
        ("broken ping-pong order", |s| {
            let turn = bar(s, "turn");
            program(s, RoleKind::Consumer).iteration.push(Op::Signal {
                bar: turn,
                index: Index::Next,
                who: Who::All,
            })
        }),
        ("broken ping-pong order", |s| {
            program(s, RoleKind::Consumer)
                .exit
                .retain(|op| !matches!(op, Op::Sync { .. }))
        }),
    ];
    for (expect, edit) in edits {
        let mut k = scheduled(&ptx_examples::build("attention", &[("causal", "true")]));
        edit(sched_mut(&mut k));
        let d = protocol_check::run(&mut k, Target::Sm90a).expect_err(expect);
        let text = d.to_string();
        assert!(text.contains(expect), "{expect}: {text}");
        assert!(text.contains("examples/src/attention.rs"), "{text}");
    }
}

#[test]
fn another_kernel_of_attention_shape_gets_the_same_schedule() {
    // Soft-capped attention: other code between the mmas, a mask in every block; the
    // overlap pass sees only the structure.
    for d in [64, 128] {
        let built = softcap::softcap_attention
            .build(&softcap::spec(d))
            .expect("builds");
        let mut k = scheduled(&built);
        let s = sched(&k);
        let o = s.overlap.as_ref().expect("rotated");
        assert!(o.turns.is_some() && o.rescale.is_some(), "d={d}");
        // Its epilogue divides by l (`acc / l`), not the shape the deferral proves exact for.
        assert!(o.defer.is_none(), "d={d}");
        assert_eq!(s.stages, 3, "d={d}: one stage more than the 2 asked for");
        protocol_check::run(&mut k, Target::Sm90a).expect("the rotated protocol is sound");
        let m = kiln_ptx::compile(&built, Target::Sm90a).expect("compile");
        assert!(m.ptx.contains("rotated loop: steady state"), "d={d}");
    }
}

#[test]
fn unscheduled_kernels_are_lowered_the_plain_way_with_a_note() {
    // wgmma's N is a multiple of 16 here (the narrowest swizzled TMA box of B); a 32-row
    // tile is half a warpgroup's. Such kernels get no warp roles on sm_90a, with a note at
    // the mma saying why; their mma runs as wgmma where its operands allow (B stored
    // `[N, K]`: 8 rows of swizzled K), else on mma.sync with a second note saying why not
    // (B's 16-byte rows are not swizzled; a 1x4 warp grid is no stack of warpgroups).
    for (kernel, overrides, why_not) in [
        (
            "gemm",
            &[("BN", "8")][..],
            Some("not a multiple of 32 bytes"),
        ),
        ("gemm", &[("BN", "8"), ("b_col_major", "true")][..], None),
        ("gemm", &[("BM", "32")][..], Some("warp grid is 1x4")),
    ] {
        let k = ptx_examples::build(kernel, overrides);
        let mut lowered = k.clone();
        kiln_ir::passes::run_pipeline(&mut lowered, Target::Sm90a, &mut |_, _| {})
            .expect("lowered");
        assert!(lowered.schedule.sched.is_none(), "{kernel} {overrides:?}");
        let note = lowered.schedule.notes.first().expect("a note");
        let how = match why_not {
            Some(_) => "sm_90a: lowered with mma.sync and cp.async",
            None => "sm_90a: lowered with cp.async and wgmma",
        };
        assert!(
            note.text.starts_with(how) && note.loc.to_string().contains("examples/src/gemm.rs"),
            "{kernel} {overrides:?}: {note:?}"
        );
        assert!(kiln_ir::print::print_kernel(&lowered).contains("note: sm_90a"));
        let m = kiln_ptx::compile(&k, Target::Sm90a).expect("compiles the plain way");
        assert!(m.ptx.contains(&format!("// note: {how}")));
        match why_not {
            Some(why) => {
                assert!(m.ptx.contains("mma.sync") && !m.ptx.contains("wgmma.mma_async"));
                let mma_note = &lowered.schedule.notes[1];
                assert!(
                    mma_note.text.contains("not wgmma") && mma_note.text.contains(why),
                    "{kernel} {overrides:?}: {mma_note:?}"
                );
            }
            None => assert!(!m.ptx.contains("mma.sync") && m.ptx.contains("wgmma.mma_async")),
        }
    }
}

#[test]
fn a_broken_tma_store_protocol_is_a_compiler_error_at_the_store() {
    let mut k = scheduled(&ptx_examples::build("gemm", &[]));
    let st = sched_mut(&mut k).stores.first_mut().expect("a TMA store");
    // Without the fence, the copy engine may read the staging tile before the writes land.
    st.round.retain(|&op| op != Op::FenceProxyAsync);
    let e = protocol_check::run(&mut k, Target::Sm90a).expect_err("unfenced");
    let text = e.to_string();
    assert!(text.contains("epilogue store's TMA protocol"), "{text}");
    assert!(text.contains("fence.proxy.async"), "{text}");
    assert!(
        text.contains("examples/src/gemm.rs"),
        "at the store: {text}"
    );
}
