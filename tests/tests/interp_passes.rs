//! The pass pipeline against the verifier and the interpreter: every example kernel verifies
//! after every pass that runs, on every target; and on sm_80, whose pipeline runs to the
//! end, the scheduled kernel still interprets to the f64 reference (the passes only fold
//! and annotate, so the semantics must not change).

use kiln_ir::dsl::AnyKernelDef;
use kiln_ir::interp::{HostArg, run};
use kiln_ir::passes::run_pipeline;
use kiln_ir::verify::verify;
use kiln_ir::{DType, Kernel, Target};
use kiln_tests::check::{Case, assert_close, poisoned, tolerance};
use kiln_tests::inputs::{Dist, Rng, tensor};
use kiln_tests::reference;

/// `def` built for `defines` (`-D` text, others at their defaults) and run through the whole
/// pipeline for `target`, verifying after every pass; the pipeline's own result is returned
/// with the kernel as it stands when the pipeline stopped.
fn scheduled(
    def: &dyn AnyKernelDef,
    defines: &[(&str, &str)],
    target: Target,
) -> (Kernel, Result<(), kiln_ir::Diagnostic>) {
    let mut kernel = def
        .build_defines(&kiln_examples::owned(defines), true)
        .unwrap_or_else(|e| panic!("{e}"));
    verify(&kernel).unwrap_or_else(|e| panic!("{} as built:\n{e}", def.name()));
    let mut broken = Vec::new();
    let result = run_pipeline(&mut kernel, target, &mut |pass, k| {
        if let Err(e) = verify(k) {
            broken.push(format!("{} after `{pass}` for {target}:\n{e}", def.name()));
        }
    });
    assert!(broken.is_empty(), "{}", broken.join("\n"));
    (kernel, result)
}

#[test]
fn every_example_verifies_after_every_pass() {
    for def in kiln_examples::registry() {
        for target in Target::ALL {
            // A target the pipeline does not implement yet stops with a diagnostic; the
            // passes that did run are still verified.
            let _ = scheduled(*def, &[], target);
        }
    }
}

#[test]
fn scheduled_gemm_and_attention_still_match_references() {
    let mut rng = Rng::from_env();
    let dist = Dist::Normal;

    let (gemm, r) = scheduled(
        &kiln_examples::gemm::gemm,
        &[("BM", "64"), ("BN", "64")],
        Target::Sm80,
    );
    r.unwrap_or_else(|d| panic!("{d}"));
    let (m, n, k) = (130, 70, 50);
    let a = tensor(&mut rng, &[m, k], DType::Bf16, dist);
    let b = tensor(&mut rng, &[k, n], DType::Bf16, dist);
    let mut c = poisoned(&[m, n], DType::Bf16);
    let grid = [m.div_ceil(64) as u32, n.div_ceil(64) as u32, 1];
    run(
        &gemm,
        grid,
        &mut [
            HostArg::Tensor(&a),
            HostArg::Tensor(&b),
            HostArg::TensorMut(&mut c),
        ],
    )
    .unwrap();
    let case = Case {
        kernel: "gemm<BM=64,BN=64> after the sm_80 pipeline".into(),
        shape: format!("m={m} n={n} k={k}"),
        dist,
        seed: rng.seed(),
    };
    assert_close(&case, &c, &reference::gemm(&a, &b), tolerance(DType::Bf16));

    let (attn, r) = scheduled(
        &kiln_examples::attention::attention,
        &[("d", "64"), ("causal", "true")],
        Target::Sm80,
    );
    r.unwrap_or_else(|d| panic!("{d}"));
    let (sq, sk, d) = (150, 90, 64);
    let q = tensor(&mut rng, &[1, 2, sq, d], DType::Bf16, dist);
    let kt = tensor(&mut rng, &[1, 2, sk, d], DType::Bf16, dist);
    let v = tensor(&mut rng, &[1, 2, sk, d], DType::Bf16, dist);
    let mut o = poisoned(&[1, 2, sq, d], DType::Bf16);
    let scale = 0.125f32;
    let mut args = [
        HostArg::Tensor(&q),
        HostArg::Tensor(&kt),
        HostArg::Tensor(&v),
        HostArg::TensorMut(&mut o),
        HostArg::F32(scale),
    ];
    run(&attn, [sq.div_ceil(128) as u32, 2, 1], &mut args).unwrap();
    let case = Case {
        kernel: "attention<d=64,causal=true> after the sm_80 pipeline".into(),
        shape: format!("b=1 h=2 sq={sq} sk={sk}"),
        dist,
        seed: rng.seed(),
    };
    let want = reference::attention(&q, &kt, &v, f64::from(scale), true);
    assert_close(&case, &o, &want, tolerance(DType::Bf16));
    // Attention writes `acc * alpha + mma(p, v)`: the pipeline must have folded that add into
    // a 3-operand mma, or this test checks nothing the examples test does not.
    let fused = attn
        .ops
        .iter()
        .any(|(_, op)| op.kind == kiln_ir::OpKind::Mma && op.operands.len() == 3);
    assert!(fused, "canonicalize folded no add into an mma");
}
