//! The 2-CTA clusters of the sm_90a gemm kernels (`CLUSTER_M = 2`, `kiln_ir::cluster`): the
//! passes cluster the ring by structure, the protocol check proves it on both CTAs and
//! rejects a mutated copy of the real plan with each cluster rule's own error, and ptxas
//! assembles every clustered variant without spills or advisories with the instruction mix
//! the plan calls for. Requests that cannot be met are diagnostics at the request.

mod ptx_examples;

use kiln_ir::cluster::Cluster;
use kiln_ir::passes::protocol_check::{self, ClusterError, ProtocolError};
use kiln_ir::passes::{PASSES, run_pipeline};
use kiln_ir::ring::{Bar, InitStep, Ring, Step};
use kiln_ir::tile_scheduler::TileScheduler;
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

fn ring(k: &Kernel) -> &Ring {
    k.schedule.rings.values().next().expect("one ring")
}

fn plan(k: &Kernel) -> &Cluster {
    ring(k).cluster.as_ref().expect("a clustered ring")
}

#[test]
fn the_pair_shares_b_and_the_protocol_holds_on_both_ctas() {
    for &(name, overrides) in VARIANTS {
        let unclustered = scheduled(&ptx_examples::build(name, overrides));
        let mut k = scheduled(&clustered(name, overrides));
        let what = format!("{name} {overrides:?}");
        let (r, before) = (ring(&k), ring(&unclustered));
        let roles = k.schedule.roles.expect("warp roles");
        let c = plan(&k);
        // B (load 1) is shared; A stays each CTA's own.
        assert_eq!((c.ctas, c.shared, c.exit_sync), (2, 1, true), "{what}");
        assert_eq!(r.loads[0], before.loads[0], "{what}");
        let (b, b0) = (&r.loads[1], &before.loads[1]);
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
        assert_eq!(r.producer, before.producer, "{what}");
        assert_eq!(r.empty_count, 2 * roles.consumer_warps, "{what}");
        assert_eq!(
            r.init,
            [
                InitStep::InitBarriers,
                InitStep::FenceMbarrierInit,
                InitStep::ClusterSync
            ]
        );
        assert!(r.consumer.contains(&Step::ArrivePeer {
            bar: Bar::Empty,
            lag: 1
        }));
        // The scheduler deals pairs: groups of 8 x blocks are groups of 4 pairs.
        assert_eq!(k.schedule.tiles, Some(TileScheduler::Grouped { rows: 4 }));
        protocol_check::run(&mut k, Target::Sm90a).unwrap_or_else(|d| panic!("{what}: {d}"));
    }
}

/// A deliberate break of a clustered ring.
type Edit = fn(&mut Ring);

/// Whether an error is the one a break must give.
type Expect = fn(&ProtocolError) -> bool;

#[test]
fn each_cluster_rule_rejects_its_mutation() {
    let edits: [(&str, Edit, Expect); 7] = [
        (
            "the block synchronises instead of the cluster",
            |r| r.init[2] = InitStep::BarSync,
            |e| matches!(e, ProtocolError::Cluster(ClusterError::Init(_))),
        ),
        (
            "empty counts one CTA's consumers",
            |r| r.empty_count /= 2,
            |e| matches!(e, ProtocolError::Cluster(ClusterError::EmptyCount { .. })),
        ),
        (
            "a multicast mask that misses the peer",
            |r| plan_mut(r).multicast[1].mask = 0b10,
            |e| {
                matches!(
                    e,
                    ProtocolError::Cluster(ClusterError::Multicast { index: 1, .. })
                )
            },
        ),
        (
            "a box nobody issues",
            |r| {
                plan_mut(r).multicast.pop();
            },
            |e| matches!(e, ProtocolError::Cluster(ClusterError::Multicast { .. })),
        ),
        (
            // The count holds (two local arrivals per warp), but the peer's stage is refilled
            // by this CTA's TMA before the peer's consumers are done with it.
            "releases that never reach the peer",
            |r| {
                for s in &mut r.consumer {
                    if let Step::ArrivePeer { bar, lag } = *s {
                        *s = Step::Arrive { bar, lag };
                    }
                }
            },
            |e| matches!(e, ProtocolError::Cluster(ClusterError::Overwrite { .. })),
        ),
        (
            "the peer hears of a stage before its wgmma completed",
            |r| {
                for s in &mut r.consumer {
                    if let Step::ArrivePeer { lag, .. } = s {
                        *lag = 0;
                    }
                }
            },
            |e| matches!(e, ProtocolError::EarlyRelease { .. }),
        ),
        (
            "no cluster barrier before exit",
            |r| plan_mut(r).exit_sync = false,
            |e| matches!(e, ProtocolError::Cluster(ClusterError::AfterExit { .. })),
        ),
    ];
    for (what, edit, expected) in edits {
        for b_col_major in ["false", "true"] {
            let k = scheduled(&clustered("gemm", &[("b_col_major", b_col_major)]));
            let roles = k.schedule.roles.expect("warp roles");
            let mut r = ring(&k).clone();
            protocol_check::check(&r, &roles).expect("the real plan is sound");
            edit(&mut r);
            let e = protocol_check::check(&r, &roles).expect_err(what);
            assert!(expected(&e), "{what}: got {e}");
        }
    }
    // Through the pass, a broken cluster rule is a compiler error at the user's loop.
    let mut k = scheduled(&clustered("gemm", &[]));
    for r in k.schedule.rings.values_mut() {
        r.empty_count /= 2;
    }
    let d = protocol_check::run(&mut k, Target::Sm90a).expect_err("empty's count");
    let text = d.to_string();
    assert!(text.contains("cluster: `empty` counts 8 arrivals per phase; the consumers of the cluster's 2 CTAs make 16"), "{text}");
    assert!(text.contains("examples/src/gemm.rs"), "{text}");
    // Without its peer releases the stages never free: the producers wait forever.
    let k = scheduled(&clustered("gemm", &[]));
    let mut r = ring(&k).clone();
    r.consumer.retain(|s| !matches!(s, Step::ArrivePeer { .. }));
    let e = protocol_check::check(&r, &k.schedule.roles.expect("roles")).expect_err("deadlock");
    assert!(matches!(e, ProtocolError::Deadlock { .. }), "{e}");
    assert!(e.to_string().contains("CTA 1"), "{e}");
    // A ring without a cluster may not release on a peer.
    let k = scheduled(&ptx_examples::build("gemm", &[]));
    let mut r = ring(&k).clone();
    r.consumer.push(Step::ArrivePeer {
        bar: Bar::Empty,
        lag: 1,
    });
    let e = protocol_check::check(&r, &k.schedule.roles.expect("roles")).expect_err("peer");
    assert!(
        matches!(
            e,
            ProtocolError::Cluster(ClusterError::PeerWithoutCluster(_))
        ),
        "{e}"
    );
}

fn plan_mut(r: &mut Ring) -> &mut Cluster {
    r.cluster.as_mut().expect("a clustered ring")
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
