//! The 2-SM form of the sm_100a gemm kernels (`CLUSTER_M = 2`, `kiln_ir::sched::cluster::Pair`): a
//! cluster of two CTAs computes a 256-row tile as one `tcgen05.mma.cta_group::2` issued by the
//! leader CTA's MMA thread, each CTA loading its own A tile and half of B's. The passes pair
//! the ring by structure, the protocol check proves the pair (on both CTAs) and rejects a
//! mutated copy of the real schedule IR with each 2-SM rule's own error, and ptxas assembles
//! every variant without spills or advisories with the instruction mix the plan calls for.
//! Nothing here runs on a GPU: no Blackwell is available.

mod ptx_examples;

use kiln_ir::passes::protocol_check::{self, ClusterError, ProtocolError, TmemError};
use kiln_ir::passes::{PASSES, run_pipeline};
use kiln_ir::sched::cluster::Pair;
use kiln_ir::sched::tma::Operand;
use kiln_ir::sched::{BarrierId, MmaPart, Op, Program, Role, RoleKind, Sched};
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

/// The paired variants: both B layouts, both tile widths, a 32-wide K step, f16, the fused
/// epilogues (at BN = 256 held in chunks).
const VARIANTS: &[(&str, &[(&str, &str)])] = &[
    ("gemm", &[]),
    ("gemm", &[("b_col_major", "true")]),
    ("gemm", &[("BN", "256")]),
    ("gemm", &[("BN", "256"), ("b_col_major", "true")]),
    ("gemm", &[("BK", "32")]),
    ("gemm", &[("dtype", "f16")]),
    ("gemm_bias_act", &[("act", "1")]),
    ("gemm_bias_act", &[("act", "2")]),
    ("gemm_bias_act", &[("act", "3"), ("b_col_major", "true")]),
    ("gemm_alpha_beta", &[]),
    ("gemm_bias_act", &[("BN", "256"), ("act", "1")]),
    ("gemm_bias_act", &[("BN", "256"), ("act", "2")]),
    ("gemm_alpha_beta", &[("BN", "256")]),
];

/// `name` with `overrides` and `CLUSTER_M = 2`.
fn paired(name: &str, overrides: &[(&str, &str)]) -> Kernel {
    let mut o = overrides.to_vec();
    o.push(("CLUSTER_M", "2"));
    ptx_examples::build(name, &o)
}

/// The paired gemm's schedule IR, as the passes write it.
fn plan(overrides: &[(&str, &str)]) -> Sched {
    let k = scheduled(&paired("gemm", overrides));
    k.schedule.sched.expect("a schedule")
}

fn bar(s: &Sched, name: &str) -> BarrierId {
    let b = s.barriers.iter().find(|(_, b)| b.name == name);
    b.expect("the barrier").0
}

/// The arrival count of mbarrier `name`.
fn count(s: &Sched, name: &str) -> u32 {
    s.mbarrier(bar(s, name)).expect("an mbarrier").count
}

/// The schedule IR `protocol_check` proves for the paired gemm.
fn sched(overrides: &[(&str, &str)]) -> Sched {
    let mut k = scheduled(&paired("gemm", overrides));
    protocol_check::run(&mut k, Target::Sm100a).unwrap_or_else(|d| panic!("{d}"));
    k.schedule.sched.expect("a schedule")
}

/// The MMA role of the CTA of cluster rank `rank` (the leader's issues, the peer's frees).
fn mma(s: &mut Sched, rank: u32) -> &mut Role {
    let r = s
        .roles
        .iter_mut()
        .find(|r| r.kind == RoleKind::Mma && r.rank == Some(rank));
    r.expect("an MMA role of that rank")
}

fn leader(s: &mut Sched) -> &mut Program {
    &mut mma(s, 0).program
}

fn peer(s: &mut Sched) -> &mut Program {
    &mut mma(s, 1).program
}

fn sched_pair(s: &mut Sched) -> &mut Pair {
    let c = s.cluster.as_mut().and_then(|c| c.pair.as_mut());
    c.expect("a 2-SM pair")
}

fn pair(s: &Sched) -> Pair {
    s.cluster
        .as_ref()
        .and_then(|c| c.pair)
        .expect("a 2-SM pair")
}

#[test]
fn the_pair_splits_b_and_the_protocol_holds_on_both_ctas() {
    // B row-major (MN-major, stored [K, N]): each CTA loads one 64-column box of the 128;
    // column-major (K-major, stored [N, K]): 64 of the 128 rows.
    for (b_col_major, operand, half, idesc) in [
        ("false", Operand::MnMajorB, [0, 64], 0x1021_0490),
        ("true", Operand::KMajorB, [64, 0], 0x1020_0490),
    ] {
        let mut s = plan(&[("b_col_major", b_col_major)]);
        let b = &s.ring_loads().nth(1).expect("B's load").1.tma;
        assert_eq!(b.operand, operand);
        assert_eq!(
            b.tile_dims().iter().product::<u32>(),
            64 * 64,
            "{b_col_major}"
        );
        let p = pair(&s);
        assert_eq!((p.leader, p.half, p.commit_mask), (0, half, 0b11));
        let c = s.cluster.as_ref().expect("cluster");
        assert!(c.multicast.is_empty() && c.exit_sync && c.shared == 1);
        // The leader's `full` announces both CTAs' A tile and B half; `empty` hears the one
        // multicast commit.
        let full = bar(&s, "full");
        let producer = &s.role(RoleKind::Producer).expect("a producer").program;
        assert!(producer.iteration.contains(&Op::ExpectTx {
            bar: full,
            bytes: 2 * (128 * 64 * 2 + 64 * 64 * 2),
        }));
        assert_eq!((count(&s, "full"), count(&s, "empty")), (1, 1));
        // M = 256 (bits 24-28: 16) over the pair, N = 128; each TMEM holds its 128 rows.
        let tmem = s.tmem.as_ref().expect("tensor memory");
        let mma_part = tmem.mma(MmaPart::Body).expect("the mainloop's mma");
        assert_eq!(mma_part.idesc, idesc, "{b_col_major}");
        let acc = tmem.tiles.iter().find(|t| t.name == "acc").expect("acc");
        assert_eq!(acc.columns, 128);
        // The peer CTA's MMA warp frees the pair's columns after the cluster barrier.
        assert_eq!(
            peer(&mut s).exit,
            [Op::ClusterSync, Op::TmemDealloc { columns: 128 }]
        );
        // Both CTAs' epilogue warps hand TMEM back to the leader.
        let epilogue = s.role(RoleKind::Epilogue).expect("epilogue").warps;
        assert_eq!(count(&s, "acc_empty"), 2 * epilogue);
        protocol_check::check(&sched(&[("b_col_major", b_col_major)]))
            .unwrap_or_else(|e| panic!("{e}"));
    }
    for &(name, overrides) in VARIANTS {
        let mut k = scheduled(&paired(name, overrides));
        protocol_check::run(&mut k, Target::Sm100a)
            .unwrap_or_else(|d| panic!("{name} {overrides:?}: {d}"));
    }
}

type Edit = fn(&mut Sched);
type Expect = fn(&ProtocolError) -> bool;

#[test]
fn each_pair_rule_rejects_its_mutation() {
    let edits: [(&str, Edit, Expect); 11] = [
        (
            // The TMEM plan without its pair: one MMA role, of no cluster rank.
            "the MMA roles are not paired with the cluster",
            |s| {
                s.roles
                    .retain(|r| r.kind != RoleKind::Mma || r.rank != Some(1));
                mma(s, 0).rank = None;
            },
            |e| matches!(e, ProtocolError::Tmem(TmemError::PairMismatch { .. })),
        ),
        (
            "the peer frees other columns than the pair allocated",
            |s| {
                for op in &mut peer(s).exit {
                    if let Op::TmemDealloc { columns } = op {
                        *columns = 256;
                    }
                }
            },
            |e| matches!(e, ProtocolError::Tmem(TmemError::PairColumns { .. })),
        ),
        (
            "the peer issues mmas",
            |s| {
                // The leader's mainloop, in the peer's program too.
                let mainloop = leader(s).iteration.clone();
                peer(s).iteration = mainloop;
            },
            |e| matches!(e, ProtocolError::Tmem(TmemError::PeerIssues(_))),
        ),
        (
            "the commits miss the peer",
            |s| sched_pair(s).commit_mask = 0b01,
            |e| {
                matches!(
                    e,
                    ProtocolError::Tmem(TmemError::CommitMask { mask: 0b01, .. })
                )
            },
        ),
        // The old plan had a mask for the stages' commits and one for the accumulator's; the
        // schedule IR has one for every commit of the pair, so the second break is a mask
        // that misses the leader's own barriers.
        (
            "the commits miss the leader",
            |s| sched_pair(s).commit_mask = 0b10,
            |e| {
                matches!(
                    e,
                    ProtocolError::Tmem(TmemError::CommitMask { mask: 0b10, .. })
                )
            },
        ),
        (
            "the leader frees its columns without the cluster barrier",
            |s| leader(s).exit.retain(|&op| op != Op::ClusterSync),
            |e| {
                matches!(
                    e,
                    ProtocolError::Tmem(TmemError::PairExit { cta: "leader" })
                )
            },
        ),
        (
            "the peer frees its columns without the cluster barrier",
            |s| peer(s).exit.retain(|&op| op != Op::ClusterSync),
            |e| matches!(e, ProtocolError::Tmem(TmemError::PairExit { cta: "peer" })),
        ),
        // A commit before the mma releases both CTAs' stage while the mma still reads it.
        // The old checker caught the refill while that mma was in flight (`Refill`); the
        // machine runs the MMA thread ahead, so by the refill a later commit has completed
        // the mma, and what is left is the refill racing the mma's read: the producer's wait
        // acquired the commit issued before the mma.
        (
            "a stage is refilled before the pair's mma reading it completed",
            |s| leader(s).iteration.swap(1, 2),
            |e| match e {
                ProtocolError::Cluster(ClusterError::Refill { .. }) => true,
                ProtocolError::Race(r) => {
                    r.first == "read"
                        && r.first_op.starts_with("tcgen05.mma")
                        && r.second_role.ends_with("producer")
                        && r.second_op.starts_with("tma")
                }
                _ => false,
            },
        ),
        // The old plan's `exit_sync` switch took the epilogue's barrier.cluster at exit, and
        // the old machine, which ran the ring's roles alone, saw the leader's commits reach
        // a peer CTA that had left (`AfterExit`). The schedule IR has the MMA warps too,
        // whose own cluster barriers before their frees keep both CTAs until every commit
        // and remote arrival is in (the epilogue's alone is not needed; see below); with no
        // cluster barrier at any exit, the static rule on those frees sees it first.
        (
            "no cluster barrier before exit",
            |s| {
                if let Some(c) = s.cluster.as_mut() {
                    c.exit_sync = false;
                }
                for r in &mut s.roles {
                    r.program.exit.retain(|&op| op != Op::ClusterSync);
                }
            },
            |e| matches!(e, ProtocolError::Tmem(TmemError::PairExit { .. })),
        ),
        // Nobody frees the peer's columns of the collective allocation.
        (
            "the peer CTA has no MMA warp",
            |s| {
                s.roles
                    .retain(|r| r.kind != RoleKind::Mma || r.rank != Some(1))
            },
            |e| {
                matches!(
                    e,
                    ProtocolError::Tmem(TmemError::PairColumns { peer, .. }) if peer.is_empty()
                )
            },
        ),
        (
            "the leader announces one CTA's bytes",
            |s| {
                for r in &mut s.roles {
                    for op in &mut r.program.iteration {
                        if let Op::ExpectTx { bytes, .. } = op {
                            *bytes /= 2;
                        }
                    }
                }
            },
            |e| matches!(e, ProtocolError::TxBytes { .. }),
        ),
    ];
    let real = sched(&[]);
    for (what, edit, expected) in edits {
        let mut s = real.clone();
        edit(&mut s);
        let e = protocol_check::check(&s).expect_err(what);
        assert!(expected(&e), "{what}: got {e}");
    }
    // Without the epilogue's cluster barrier, each CTA still stays until its MMA warp's:
    // the leader's comes after its last commit and its wait for both CTAs' last hand-back,
    // so no commit or arrival reaches a CTA that left.
    let mut s = real.clone();
    for r in s.roles.iter_mut().filter(|r| r.kind == RoleKind::Epilogue) {
        r.program.exit.retain(|&op| op != Op::ClusterSync);
    }
    protocol_check::check(&s).expect("the MMA warps' cluster barriers keep both CTAs");
    // Through the pass, a broken rule is a compiler error at the user's loop.
    let mut k = scheduled(&paired("gemm", &[]));
    if let Some(s) = k.schedule.sched.as_mut() {
        sched_pair(s).commit_mask = 0b10;
    }
    let d = protocol_check::run(&mut k, Target::Sm100a).expect_err("commit mask");
    assert!(d.to_string().contains("must reach both"), "{d}");
    assert!(d.to_string().contains("examples/src/gemm.rs"), "{d}");
}

/// The code of the MMA warp in `ptx`: from its role comment to the epilogue's.
fn mma_warp(ptx: &str) -> &str {
    let from = ptx.find("// mma warp:").expect("mma warp");
    let to = ptx.find("// epilogue warps:").expect("epilogue");
    &ptx[from..to]
}

#[test]
fn paired_ptx_assembles_clean_with_the_2sm_instruction_mix() {
    if let Err(e) = kiln_ptx::ptxas::find_ptxas() {
        panic!("{e}");
    }
    for &(name, overrides) in VARIANTS {
        let what = format!("{name} {overrides:?}");
        let kernel = paired(name, overrides);
        let k = scheduled(&kernel);
        let s = k.schedule.sched.as_ref().expect("a schedule");
        let boxes: usize = s.ring_loads().map(|(_, l)| l.tma.boxes.len()).sum();
        let m =
            kiln_ptx::compile(&kernel, Target::Sm100a).unwrap_or_else(|e| panic!("{what}: {e}"));
        let report = kiln_ptx::ptxas::check(&m.ptx, Target::Sm100a)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(!report.spills(), "{what} spills: {report}");
        assert!(report.warnings.is_empty(), "{what}: advisories: {report}");
        let ptx = &m.ptx;
        let count = |s: &str| ptx.matches(s).count();
        assert_eq!(count(".reqnctapercluster 2, 1, 1"), 1, "{what}");
        // Every tcgen05 op of the kernel acts for the pair (ptxas rejects a mix).
        assert_eq!(count("cta_group::1"), 0, "{what}");
        assert_eq!(count("tcgen05.alloc.cta_group::2"), 1, "{what}");
        assert_eq!(count("tcgen05.relinquish_alloc_permit.cta_group::2"), 1);
        // The leader's and the peer's exits each free the columns.
        assert_eq!(count("tcgen05.dealloc.cta_group::2"), 2, "{what}");
        // Each CTA's TMA (its A tile, its B half; the producer's first iteration is peeled)
        // completes on the leader's `full`, announced by the leader alone.
        assert_eq!(count("bytes.cta_group::2 ["), 2 * boxes, "{what}");
        assert_eq!(count("multicast::cluster"), 2, "{what}");
        // Set-up, the leader's and the peer's MMA warp exits, the epilogue's exit.
        assert_eq!(count("barrier.cluster.arrive.release.aligned"), 4, "{what}");
        assert_eq!(count("barrier.cluster.wait.acquire.aligned"), 4, "{what}");
        assert_eq!(count("bar.sync 0;"), 0, "{what}");
        // Only the MMA warp issues mmas and commits, each commit multicast to both CTAs.
        let mma = mma_warp(ptx);
        assert_eq!(
            count("tcgen05.mma.cta_group::2.kind::f16"),
            mma.matches("tcgen05.mma.cta_group::2.kind::f16").count()
        );
        assert_eq!(
            mma.matches(
                "tcgen05.commit.cta_group::2.mbarrier::arrive::one.shared::cluster.multicast::cluster.b64"
            )
            .count(),
            2,
            "{what}: the stage's and acc_full's"
        );
        // The MMA warp's lane 0 of the leader alone walks the tiles: the peer's joins the
        // warp at the exit.
        assert!(mma.contains("%cluster_ctarank"), "{what}");
        assert!(mma.contains("or.pred"), "{what}");
        // The epilogue hands TMEM back on the leader's acc_empty.
        let epilogue = &ptx[ptx.find("// epilogue warps:").expect("epilogue")..];
        assert!(
            epilogue.contains("mbarrier.arrive.release.cluster.shared::cluster.b64"),
            "{what}"
        );
        assert!(epilogue.contains("mbarrier.try_wait.parity.acquire.cluster"));
    }
}

#[test]
fn the_default_form_is_unchanged_and_impossible_pairs_are_diagnostics() {
    // CLUSTER_M = 1 has none of the pair's instructions.
    let m = kiln_ptx::compile(&ptx_examples::build("gemm", &[]), Target::Sm100a).expect("1-CTA");
    for s in [
        "cta_group::2",
        "cluster_ctarank",
        "multicast",
        "mapa",
        "barrier.cluster",
        "reqnctapercluster",
    ] {
        assert!(!m.ptx.contains(s), "the 1-CTA gemm: {s}");
    }
    // A 64-column B tile does not split into two halves of whole 64-column boxes.
    let mut k = paired("gemm", &[("BN", "64")]);
    let d = run_pipeline(&mut k, Target::Sm100a, &mut |_, _| {}).expect_err("BN 64");
    let text = d.to_string();
    assert!(text.contains("cannot run in clusters of 2"), "{text}");
    assert!(text.contains("halves of whole TMA boxes"), "{text}");
    assert!(text.contains("examples/src/gemm.rs"), "{text}");
}
