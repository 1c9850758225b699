//! The CPU execution of the clustered sm_90a gemm (`CLUSTER_M = 2`,
//! [`kiln_ir::interp::run_scheduled`]): the pair of CTAs runs on one protocol machine with two
//! shared memories, each CTA's multicast writing its boxes of B into both, and the result
//! matches the f64 reference on odd shapes with few clusters (ragged pairs included), as do
//! the fused epilogues; a multicast that misses the peer, and slabs that land on each other,
//! fail it. The same for sm_100a's 2-SM pair, whose leader's mma computes both CTAs'
//! accumulators from B joined from both CTAs' halves; both CTAs loading one half fails it.

mod ptx_examples;

use kiln::ir::passes::{protocol_check, run_pipeline};
use kiln::ir::sched::{LoadId, Sched};
use kiln::ir::{DType, Kernel, Target};
use kiln_tests::check::{Case, as_stored, assert_close, rel_error, tolerance};
use kiln_tests::inputs::{Dist, Rng, gemm_operands, tensor};
use kiln_tests::reference::{self, Activation};
use kiln_tests::scheduled::{run_gemm, run_gemm_scaled};

/// The clustered gemm with `overrides`, after the sm_90a pipeline.
fn clustered(overrides: &[(&str, &str)]) -> Kernel {
    clustered_kernel("gemm", overrides)
}

/// Example kernel `name` with `overrides` in clusters of 2, after the sm_90a pipeline.
fn clustered_kernel(name: &str, overrides: &[(&str, &str)]) -> Kernel {
    let mut o = overrides.to_vec();
    o.push(("CLUSTER_M", "2"));
    let mut k = ptx_examples::build(name, &o);
    run_pipeline(&mut k, Target::Sm90a, &mut |_, _| {}).unwrap_or_else(|d| panic!("{d}"));
    assert!(k.schedule.sched.iter().all(|s| s.cluster.is_some()));
    k
}

#[test]
fn clustered_gemm_matches_reference() {
    let mut rng = Rng::from_env();
    // 3 M blocks (a ragged pair), 2 N blocks, K over several ring wraps; 1 and 2 clusters.
    for (overrides, tile, shape) in [
        (&[][..], (128, 128), (300, 200, 450)),
        (&[("b_col_major", "true")][..], (128, 128), (300, 136, 200)),
        (&[("BN", "256")][..], (128, 256), (257, 264, 130)),
        (&[("BM", "64")][..], (64, 128), (150, 130, 96)),
    ] {
        let b_col_major = overrides.contains(&("b_col_major", "true"));
        let kernel = clustered(overrides);
        let (a, b, want) = gemm_operands(&mut rng, shape, b_col_major, Dist::Normal);
        for ctas in [2, 4] {
            let got = run_gemm(&kernel, tile, &[&a, &b], shape.1, ctas)
                .unwrap_or_else(|e| panic!("{overrides:?} on {ctas} CTAs: {e}"));
            let case = Case {
                kernel: format!("gemm CLUSTER_M=2 {overrides:?}, {ctas} CTAs"),
                shape: format!("{shape:?}"),
                dist: Dist::Normal,
                seed: rng.seed(),
            };
            assert_close(&case, &got, &want, tolerance(DType::Bf16));
        }
    }
    // CTAs that do not make whole clusters are an error, not a guess.
    let kernel = clustered(&[]);
    let (a, b, _) = gemm_operands(&mut rng, (128, 128, 64), false, Dist::Normal);
    let e = run_gemm(&kernel, (128, 128), &[&a, &b], 128, 3).expect_err("3 CTAs");
    assert!(e.to_string().contains("whole number of clusters"), "{e}");
}

#[test]
fn clustered_fused_epilogues_match_reference() {
    let mut rng = Rng::from_env();
    let (m, n, k) = (300, 200, 130);
    let (a, b, ab) = gemm_operands(&mut rng, (m, n, k), false, Dist::Normal);
    // act(a @ b + bias) with GELU; 1 and 2 clusters.
    let kernel = clustered_kernel("gemm_bias_act", &[("act", "2")]);
    let bias = tensor(&mut rng, &[n], DType::Bf16, Dist::Normal);
    let want = as_stored(
        &reference::bias_act(&ab, &bias, Activation::GeluTanh),
        DType::Bf16,
    );
    for ctas in [2, 4] {
        let c = run_gemm(&kernel, (128, 128), &[&a, &b, &bias], n, ctas)
            .unwrap_or_else(|e| panic!("{e}"));
        let case = Case {
            kernel: format!("gemm_bias_act CLUSTER_M=2 act=2, {ctas} CTAs"),
            shape: format!("{m}x{n}x{k}"),
            dist: Dist::Normal,
            seed: rng.seed(),
        };
        assert_close(&case, &c, &want, tolerance(DType::Bf16));
    }
    // alpha * (a @ b) + beta * c, B column-major.
    let kernel = clustered_kernel("gemm_alpha_beta", &[("b_col_major", "true")]);
    let (a, b, ab) = gemm_operands(&mut rng, (m, n, k), true, Dist::Normal);
    let c = tensor(&mut rng, &[m, n], DType::Bf16, Dist::Normal);
    let want = as_stored(&reference::alpha_beta(&ab, &c, 0.75, -1.25), DType::Bf16);
    let d = run_gemm_scaled(&kernel, (128, 128), &[&a, &b, &c], &[0.75, -1.25], n, 2)
        .unwrap_or_else(|e| panic!("{e}"));
    let case = Case {
        kernel: "gemm_alpha_beta CLUSTER_M=2 b_col_major".into(),
        shape: format!("{m}x{n}x{k}"),
        dist: Dist::Normal,
        seed: rng.seed(),
    };
    assert_close(&case, &d, &want, tolerance(DType::Bf16));
}

#[test]
fn multicast_faults_fail_the_execution() {
    let mut rng = Rng::from_env();
    let shape = (256, 128, 192);
    let (a, b, want) = gemm_operands(&mut rng, shape, false, Dist::Normal);
    // A box of CTA 1's that lands only in CTA 0: CTA 1's `full` never gets its bytes.
    let mut kernel = clustered(&[]);
    if let Some(c) = sched(&mut kernel).cluster.as_mut() {
        c.multicast[1].mask = 0b01;
    }
    let e = run_gemm(&kernel, (128, 128), &[&a, &b], 128, 2).expect_err("a mask without the peer");
    assert!(e.to_string().contains("deadlock"), "{e}");
    // The two slabs of B's first box written at one offset: every barrier still sees its
    // bytes, so the protocol check passes, but half of that box's rows are never in
    // shared memory.
    let mut kernel = clustered(&[]);
    let s = sched(&mut kernel);
    let shared = s.cluster.as_ref().expect("clustered").shared;
    let boxes = &mut s.loads[LoadId::from_index(shared)].tma.boxes;
    boxes[1].smem_offset = boxes[0].smem_offset;
    protocol_check::check(s).expect("the protocol cannot see it");
    let got = run_gemm(&kernel, (128, 128), &[&a, &b], 128, 2).expect("runs");
    let err = rel_error(&got.to_f64_vec(), &want);
    assert!(
        err.is_nan() || err > 0.1,
        "slabs over each other gave rel error {err}"
    );
}

/// The gemm with `overrides` paired in sm_100a's 2-SM form, after the sm_100a pipeline.
fn paired(overrides: &[(&str, &str)]) -> Kernel {
    let mut o = overrides.to_vec();
    o.push(("CLUSTER_M", "2"));
    let mut k = ptx_examples::build("gemm", &o);
    run_pipeline(&mut k, Target::Sm100a, &mut |_, _| {}).unwrap_or_else(|d| panic!("{d}"));
    let s = k.schedule.sched.as_ref().expect("a schedule");
    assert!(s.cluster.as_ref().is_some_and(|c| c.pair.is_some()));
    k
}

#[test]
fn paired_sm100a_gemm_matches_reference() {
    // The 2-SM form: the leader's mma computes both CTAs' accumulators from each CTA's A and
    // B joined from both CTAs' halves; odd shapes with a ragged pair, 1 and 2 clusters.
    let mut rng = Rng::from_env();
    for (overrides, tile, shape) in [
        (&[][..], (128, 128), (300, 200, 450)),
        (&[("b_col_major", "true")][..], (128, 128), (300, 136, 200)),
        (&[("BN", "256")][..], (128, 256), (257, 264, 130)),
    ] {
        let b_col_major = overrides.contains(&("b_col_major", "true"));
        let kernel = paired(overrides);
        let (a, b, want) = gemm_operands(&mut rng, shape, b_col_major, Dist::Normal);
        for ctas in [2, 4] {
            let got = run_gemm(&kernel, tile, &[&a, &b], shape.1, ctas)
                .unwrap_or_else(|e| panic!("{overrides:?} on {ctas} CTAs: {e}"));
            let case = Case {
                kernel: format!("sm_100a gemm CLUSTER_M=2 {overrides:?}, {ctas} CTAs"),
                shape: format!("{shape:?}"),
                dist: Dist::Normal,
                seed: rng.seed(),
            };
            assert_close(&case, &got, &want, tolerance(DType::Bf16));
        }
    }
    // Both CTAs loading the first half of B: every barrier sees its bytes, so the protocol
    // check passes, but the mma reads that half twice and never the second.
    let shape = (256, 128, 192);
    let (a, b, want) = gemm_operands(&mut rng, shape, false, Dist::Normal);
    let mut kernel = paired(&[]);
    let s = sched(&mut kernel);
    if let Some(p) = s.cluster.as_mut().and_then(|c| c.pair.as_mut()) {
        p.half = [0, 0];
    }
    protocol_check::check(s).expect("the protocol cannot see it");
    let got = run_gemm(&kernel, (128, 128), &[&a, &b], shape.1, 2).expect("runs");
    let err = rel_error(&got.to_f64_vec(), &want);
    assert!(
        err.is_nan() || err > 0.1,
        "one half of B twice gave rel error {err}"
    );
}

/// The schedule IR of a scheduled kernel.
fn sched(kernel: &mut Kernel) -> &mut Sched {
    kernel.schedule.sched.as_mut().expect("a schedule")
}
