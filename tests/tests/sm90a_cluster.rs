//! The 2-CTA clusters of the sm_90a gemm kernels (`CLUSTER_M = 2`, `kiln_ir::sched::cluster`): the
//! passes cluster the ring by structure, the protocol check proves it on both CTAs and
//! rejects a mutated copy of the real schedule IR with each cluster rule's own error, and ptxas
//! assembles every clustered variant without spills or advisories with the instruction mix
//! the plan calls for. Requests that cannot be met are diagnostics at the request.

mod ptx_examples;

use kiln_ir::passes::protocol_check::{self, ClusterError, ProtocolError};
use kiln_ir::passes::{PASSES, run_pipeline};
use kiln_ir::sched::cluster::Cluster;
use kiln_ir::sched::tiles::TileScheduler;
use kiln_ir::sched::{BarrierId, Load, Op, Program, RoleKind, Sched};
use kiln_ir::{Kernel, Target};

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

/// The clustered variants: the gemm's B layouts and tile widths, the 64-row tile, a 32-wide
/// K step, and the fused epilogues (at BN = 128: at 256 their epilogue spills, clustered or
/// not).
const VARIANTS: &[(&str, &[(&str, &str)])] = &[
    ("gemm", &[]),
    ("gemm", &[("b_col_major", "true")]),
    ("gemm", &[("BN", "256"), ("STAGES", "4")]),
    ("gemm", &[("BN", "256"), ("b_col_major", "true")]),
    ("gemm", &[("BM", "64")]),
    ("gemm", &[("BK", "32"), ("STAGES", "5")]),
    ("gemm_bias_act", &[("act", "2")]),
    ("gemm_bias_act", &[("act", "3"), ("b_col_major", "true")]),
    ("gemm_alpha_beta", &[]),
    (
        "gemm_alpha_beta",
        &[("b_col_major", "true"), ("dtype", "f16")],
    ),
];

/// `name` with `overrides` and `CLUSTER_M = 2`.
fn clustered(name: &str, overrides: &[(&str, &str)]) -> Kernel {
    let mut o = overrides.to_vec();
    o.push(("CLUSTER_M", "2"));
    ptx_examples::build(name, &o)
}

/// The schedule IR of `k` (scheduled).
fn sch(k: &Kernel) -> &Sched {
    k.schedule.sched.as_ref().expect("a schedule")
}

/// The ring's loads of `k`, in order: A, then B.
fn loads(k: &Kernel) -> Vec<&Load> {
    sch(k).ring_loads().map(|(_, l)| l).collect()
}

fn plan(k: &Kernel) -> &Cluster {
    sch(k).cluster.as_ref().expect("a clustered schedule")
}

/// The arrival count of `k`'s mbarrier `name`.
fn count(s: &Sched, name: &str) -> u32 {
    s.mbarrier(bar(s, name)).expect("an mbarrier").count
}

#[test]
fn the_pair_shares_b_and_the_protocol_holds_on_both_ctas() {
    for &(name, overrides) in VARIANTS {
        let unclustered = scheduled(&ptx_examples::build(name, overrides));
        let mut k = scheduled(&clustered(name, overrides));
        let what = format!("{name} {overrides:?}");
        let (r, before) = (loads(&k), loads(&unclustered));
        let (s, s0) = (sch(&k), sch(&unclustered));
        let consumers = s.role(RoleKind::Consumer).expect("consumers").warps;
        let c = plan(&k);
        // B (load 1) is shared; A stays each CTA's own.
        assert_eq!((c.ctas, c.shared, c.exit_sync), (2, 1, true), "{what}");
        assert_eq!(r[0].tma, before[0].tma, "{what}");
        let (b, b0) = (&r[1].tma, &before[1].tma);
        // Each box of B is issued as two slabs of half its rows, one per CTA, into both.
        assert_eq!(b.box_dims, [b0.box_dims[0] / 2, b0.box_dims[1]], "{what}");
        assert_eq!(b.boxes.len(), 2 * b0.boxes.len(), "{what}");
        assert_eq!(
            (b.tile_dims(), b.tile_bytes()),
            (b0.tile_dims(), b0.tile_bytes())
        );
        assert_eq!(c.multicast.len(), b.boxes.len());
        for (i, m) in c.multicast.iter().enumerate() {
            assert_eq!((m.issuer, m.mask), (i as u32 % 2, 0b11), "{what}");
        }
        // `full` still expects the whole stage; `empty` both CTAs' consumer warps.
        let producer = |s: &Sched| {
            s.role(RoleKind::Producer)
                .expect("a producer")
                .program
                .clone()
        };
        assert_eq!(producer(s), producer(s0), "{what}");
        assert_eq!(count(s, "full"), count(s0, "full"), "{what}");
        assert_eq!(count(s, "empty"), 2 * consumers, "{what}");
        assert_eq!(
            s.setup,
            [Op::InitBarriers, Op::FenceBarrierInit, Op::ClusterSync],
            "{what}"
        );
        let empty = bar(s, "empty");
        let program = &s.role(RoleKind::Consumer).expect("consumers").program;
        assert!(
            program
                .iteration
                .contains(&Op::ArrivePeer { bar: empty, lag: 1 })
        );
        // The scheduler deals pairs: groups of 8 x blocks are groups of 4 pairs.
        assert_eq!(s.tiles, Some(TileScheduler::Grouped { rows: 4 }));
        protocol_check::run(&mut k, Target::Sm90a).unwrap_or_else(|d| panic!("{what}: {d}"));
    }
}

/// The schedule IR `protocol_check` proves for `kernel` (scheduled).
fn sched(kernel: &Kernel) -> Sched {
    let mut k = kernel.clone();
    protocol_check::run(&mut k, Target::Sm90a).unwrap_or_else(|d| panic!("{d}"));
    k.schedule.sched.expect("a schedule")
}

fn consumer(s: &mut Sched) -> &mut Program {
    let r = s.roles.iter_mut().find(|r| r.kind == RoleKind::Consumer);
    &mut r.expect("a consumer role").program
}

fn bar(s: &Sched, name: &str) -> BarrierId {
    let b = s.barriers.iter().find(|(_, b)| b.name == name);
    b.expect("the barrier").0
}

fn cluster_mut(s: &mut Sched) -> &mut Cluster {
    s.cluster.as_mut().expect("a clustered schedule")
}

/// A deliberate break of a clustered schedule.
type Edit = fn(&mut Sched);

/// Whether an error is the one a break must give.
type Expect = fn(&ProtocolError) -> bool;

#[test]
fn each_cluster_rule_rejects_its_mutation() {
    let edits: [(&str, Edit, Expect); 7] = [
        (
            "the block synchronises instead of the cluster",
            |s| {
                for op in &mut s.setup {
                    if *op == Op::ClusterSync {
                        *op = Op::CtaSync;
                    }
                }
            },
            |e| matches!(e, ProtocolError::Cluster(ClusterError::Init(_))),
        ),
        (
            "empty counts one CTA's consumers",
            |s| {
                let empty = bar(s, "empty");
                if let Some(m) = s.barriers[empty].as_mbarrier_mut() {
                    m.count /= 2;
                }
            },
            |e| matches!(e, ProtocolError::Cluster(ClusterError::EmptyCount { .. })),
        ),
        (
            "a multicast mask that misses the peer",
            |s| cluster_mut(s).multicast[1].mask = 0b10,
            |e| {
                matches!(
                    e,
                    ProtocolError::Cluster(ClusterError::Multicast { index: 1, .. })
                )
            },
        ),
        (
            "a box nobody issues",
            |s| {
                cluster_mut(s).multicast.pop();
            },
            |e| matches!(e, ProtocolError::Cluster(ClusterError::Multicast { .. })),
        ),
        (
            // The count holds (two local arrivals per warp), but the peer's stage is refilled
            // by this CTA's TMA before the peer's consumers are done with it.
            "releases that never reach the peer",
            |s| {
                for op in &mut consumer(s).iteration {
                    if let Op::ArrivePeer { bar, lag } = *op {
                        *op = Op::Arrive { bar, lag };
                    }
                }
            },
            |e| matches!(e, ProtocolError::Cluster(ClusterError::Overwrite { .. })),
        ),
        (
            "the peer hears of a stage before its wgmma completed",
            |s| {
                for op in &mut consumer(s).iteration {
                    if let Op::ArrivePeer { lag, .. } = op {
                        *lag = 0;
                    }
                }
            },
            |e| matches!(e, ProtocolError::EarlyRelease { .. }),
        ),
        (
            // The plan's switch and the consumers' barrier.cluster at exit that it stands for.
            "no cluster barrier before exit",
            |s| {
                cluster_mut(s).exit_sync = false;
                for r in &mut s.roles {
                    r.program.exit.retain(|&op| op != Op::ClusterSync);
                }
            },
            |e| matches!(e, ProtocolError::Cluster(ClusterError::AfterExit { .. })),
        ),
    ];
    for b_col_major in ["false", "true"] {
        let real = sched(&scheduled(&clustered(
            "gemm",
            &[("b_col_major", b_col_major)],
        )));
        protocol_check::check(&real).expect("the real schedule is sound");
        for (what, edit, expected) in edits {
            let mut s = real.clone();
            edit(&mut s);
            let e = protocol_check::check(&s).expect_err(what);
            assert!(expected(&e), "{what}: got {e}");
        }
    }
    // Through the pass, a broken cluster rule is a compiler error at the user's loop.
    let mut k = scheduled(&clustered("gemm", &[]));
    let s = k.schedule.sched.as_mut().expect("a schedule");
    let empty = bar(s, "empty");
    if let Some(m) = s.barriers[empty].as_mbarrier_mut() {
        m.count /= 2;
    }
    let d = protocol_check::run(&mut k, Target::Sm90a).expect_err("empty's count");
    let text = d.to_string();
    assert!(text.contains("cluster: `empty` counts 8 arrivals per phase; the consumers of the cluster's 2 CTAs make 16"), "{text}");
    assert!(text.contains("examples/src/gemm.rs"), "{text}");
    // Without its peer releases the stages never free: the producers wait forever.
    let mut s = sched(&scheduled(&clustered("gemm", &[])));
    consumer(&mut s)
        .iteration
        .retain(|op| !matches!(op, Op::ArrivePeer { .. }));
    let e = protocol_check::check(&s).expect_err("deadlock");
    assert!(matches!(e, ProtocolError::Deadlock { .. }), "{e}");
    assert!(e.to_string().contains("CTA 1"), "{e}");
    // A ring without a cluster may not release on a peer.
    let mut s = sched(&scheduled(&ptx_examples::build("gemm", &[])));
    let empty = bar(&s, "empty");
    consumer(&mut s)
        .iteration
        .push(Op::ArrivePeer { bar: empty, lag: 1 });
    let e = protocol_check::check(&s).expect_err("peer");
    assert!(
        matches!(
            e,
            ProtocolError::Cluster(ClusterError::PeerWithoutCluster(_))
        ),
        "{e}"
    );
}

#[test]
fn clustered_ptx_assembles_clean_with_multicast_and_cluster_barriers() {
    if let Err(e) = kiln_ptx::ptxas::find_ptxas() {
        panic!("{e}");
    }
    for &(name, overrides) in VARIANTS {
        let what = format!("{name} {overrides:?}");
        let kernel = clustered(name, overrides);
        let boxes = plan(&scheduled(&kernel)).multicast.len();
        let m = kiln_ptx::compile(&kernel, Target::Sm90a).unwrap_or_else(|e| panic!("{e}"));
        let report =
            kiln_ptx::ptxas::check(&m.ptx, Target::Sm90a).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(!report.spills(), "{what} spills: {report}");
        assert!(report.warnings.is_empty(), "{what}: advisories: {report}");
        let count = |s: &str| m.ptx.matches(s).count();
        assert_eq!(count(".reqnctapercluster 2, 1, 1"), 1, "{what}");
        // The producer's first iteration is peeled (persistent), so each box is written twice.
        assert_eq!(count(".multicast::cluster"), 2 * boxes, "{what}");
        assert!(count("mapa.shared::cluster.u32") >= 1, "{what}");
        assert_eq!(
            count("mapa.shared::cluster.u32"),
            count("mbarrier.arrive.release.cluster.shared::cluster.b64"),
            "{what}"
        );
        // The set-up and the consumers' exit.
        assert_eq!(count("barrier.cluster.arrive.release.aligned"), 2, "{what}");
        assert_eq!(count("barrier.cluster.wait.acquire.aligned"), 2, "{what}");
        assert!(
            count("mbarrier.try_wait.parity.acquire.cluster") >= 1,
            "{what}"
        );
        assert_eq!(count("bar.sync 0;"), 0, "{what}");
        assert!(count("%clusterid.x") >= 2 && count("%cluster_ctarank") >= 3);
        // The same kernel without a cluster has none of it.
        let plain = ptx_examples::build(name, overrides);
        let p = kiln_ptx::compile(&plain, Target::Sm90a)
            .expect("compile")
            .ptx;
        for s in [
            "cluster_ctarank",
            "multicast",
            "mapa",
            "barrier.cluster",
            "reqnctapercluster",
        ] {
            assert!(!p.contains(s), "{what} without a cluster: {s}");
        }
    }
}

#[test]
fn cluster_requests_that_cannot_be_met_are_diagnostics() {
    // A size the DSL does not take, at the request.
    let text = kiln_examples::build("gemm", &[("CLUSTER_M", "3")], true).expect_err("3 CTAs");
    assert!(text.contains("1 or 2 CTAs"), "{text}");
    assert!(text.contains("examples/src/gemm.rs"), "{text}");
    // A target without clusters (sm_100a pairs in its own 2-SM form, `sm100a_cluster`), and
    // a gemm whose tensors TMA cannot read.
    let kernel = clustered("gemm", &[]);
    let mut k = kernel.clone();
    let d = run_pipeline(&mut k, Target::Sm80, &mut |_, _| {}).expect_err("no clusters");
    let text = d.to_string();
    assert!(text.contains("cannot run in clusters of 2"), "{text}");
    assert!(text.contains("sm_90a or sm_100a"), "{text}");
    assert!(text.contains("examples/src/gemm.rs"), "{text}");
    let mut k = ptx_examples::build_aligned("gemm", &[("CLUSTER_M", "2")], false);
    let d = run_pipeline(&mut k, Target::Sm90a, &mut |_, _| {}).expect_err("no ring");
    assert!(d.to_string().contains("cannot run in clusters of 2"), "{d}");
    // The request shows in the IR (and so in the disk cache's key).
    assert!(kiln_ir::print::print_kernel(&kernel).contains("num_warps=4 cluster=2 {"));
}
