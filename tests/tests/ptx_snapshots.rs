//! Snapshots of the IR after every pass and of the PTX of every test kernel, each PTX assembled
//! by ptxas for its target with its spills checked: on sm_80 none but [`KNOWN_SPILLS`]; on
//! sm_90a ([`SM90A`]) and sm_100a ([`SM100A`], never run: no Blackwell GPU here) no spill and no
//! ptxas advisory (no C75xx wgmma serialisation). ptxas comes from `$KILN_PTXAS`, else
//! `.tools/cuda/bin/ptxas` (`scripts/ensure-cuda-tool ptxas` installs it); without it the test
//! fails and says how to install it.

mod ptx_examples;

use kiln_ir::Target;
use kiln_ir::passes::run_pipeline;
use kiln_ir::print::print_kernel;

/// Spilled bytes (stores) ptxas reports today for each kernel; every kernel not listed must
/// have none.
// FIXME: attention at BM=128 with 4 warps keeps 192 accumulator registers per thread (d = 128)
// and the block-uniform mask branch adds the mask's registers on top, so ptxas spills a few
// loop-invariant addresses. Measured on the H200 this version is still faster than the
// spill-free ones (8 warps; two loops, masked and unmasked). The goal is zero everywhere.
const KNOWN_SPILLS: &[(&str, u32)] = &[("attention", 40), ("attention_causal", 40)];

/// Kernels snapshotted and assembled for sm_90a (IR snapshots `<name>@sm_90a@<pass>`), and
/// whether they load through TMA (the unaligned gemm keeps the cp.async + mma.sync lowering).
const SM90A: &[(&str, bool)] = &[
    ("gemm", true),
    ("gemm_bcol", true),
    ("gemm_unaligned", false),
    ("attention", true),
    ("attention_causal", true),
    ("attention_d64", true),
    ("attention_bn128", true),
    ("attention_bn128_causal", true),
    ("attention_d64_causal", true),
    ("attention_d256", true),
    ("attention_d256_causal", true),
    ("attention_d96", true),
    ("attention_d64_bm192", true),
    ("attention_d64_bm192_causal", true),
    ("attention_varlen_d64", true),
    ("attention_varlen_lse_d64_causal", true),
    ("attention_varlen_lse_bn160_causal", true),
    ("attention_varlen_d64_bm192", true),
];

/// Kernels snapshotted and assembled for sm_100a (IR snapshots `<name>@sm_100a@<pass>`):
/// the gemms, whose mainloop becomes tcgen05 with a TMEM accumulator.
const SM100A: &[&str] = &["gemm", "gemm_bcol"];

/// Attention kernels scheduled on sm_100a (FlashAttention-4 style): snapshots of the IR after
/// the `tmem` pass (`<name>@sm_100a@tmem`) and of the PTX, assembled like [`SM100A`].
const SM100A_ATTENTION: &[&str] = &[
    "attention",
    "attention_causal",
    "attention_d64",
    "attention_d64_causal",
    "attention_varlen_d64",
    "attention_varlen_lse_d64_causal",
];

#[test]
fn sm100a_attention_snapshots_assemble_clean() {
    if let Err(e) = kiln_ptx::ptxas::find_ptxas() {
        panic!("{e}");
    }
    let mut s = insta::Settings::clone_current();
    s.set_prepend_module_to_snapshot(false);
    for (name, kernel) in ptx_examples::all_sm90a() {
        if !SM100A_ATTENTION.contains(&name) {
            continue;
        }
        let mut k = kernel.clone();
        let mut after_tmem = None;
        run_pipeline(&mut k, Target::Sm100a, &mut |pass, k| {
            if pass == "tmem" {
                after_tmem = Some(print_kernel(k));
            }
        })
        .expect("pipeline");
        s.set_snapshot_path("../snapshots/ir");
        let text = after_tmem.expect("the tmem pass ran");
        s.bind(|| insta::assert_snapshot!(format!("{name}@sm_100a@tmem"), text));
        let m = kiln_ptx::compile(&kernel, Target::Sm100a).expect("compile");
        s.set_snapshot_path("../snapshots/ptx");
        s.bind(|| insta::assert_snapshot!(format!("{name}@sm_100a"), m.ptx));
        let report = kiln_ptx::ptxas::check(&m.ptx, Target::Sm100a)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(!report.spills(), "{name} on sm_100a spills: {report}");
        assert!(
            report.warnings.is_empty(),
            "{name} on sm_100a: ptxas advisories: {report}"
        );
    }
}

#[test]
fn sm100a_snapshots_assemble_clean() {
    if let Err(e) = kiln_ptx::ptxas::find_ptxas() {
        panic!("{e}");
    }
    let mut s = insta::Settings::clone_current();
    s.set_prepend_module_to_snapshot(false);
    for (name, kernel) in ptx_examples::all_sm90a() {
        if !SM100A.contains(&name) {
            continue;
        }
        let mut k = kernel.clone();
        let mut dumps = Vec::new();
        run_pipeline(&mut k, Target::Sm100a, &mut |pass, k| {
            dumps.push((pass.to_string(), print_kernel(k)))
        })
        .expect("pipeline");
        for (pass, text) in dumps {
            s.set_snapshot_path("../snapshots/ir");
            s.bind(|| insta::assert_snapshot!(format!("{name}@sm_100a@{pass}"), text));
        }
        let m = kiln_ptx::compile(&kernel, Target::Sm100a).expect("compile");
        assert!(!m.tensor_maps.is_empty(), "{name}: TMA on sm_100a");
        s.set_snapshot_path("../snapshots/ptx");
        s.bind(|| insta::assert_snapshot!(format!("{name}@sm_100a"), m.ptx));
        let report = kiln_ptx::ptxas::check(&m.ptx, Target::Sm100a)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(!report.spills(), "{name} on sm_100a spills: {report}");
        assert!(
            report.warnings.is_empty(),
            "{name} on sm_100a: ptxas advisories: {report}"
        );
    }
}

#[test]
fn sm90a_snapshots_assemble_clean() {
    if let Err(e) = kiln_ptx::ptxas::find_ptxas() {
        panic!("{e}");
    }
    let mut s = insta::Settings::clone_current();
    s.set_prepend_module_to_snapshot(false);
    for (name, kernel) in ptx_examples::all_sm90a() {
        let Some(&(_, tma)) = SM90A.iter().find(|(n, _)| *n == name) else {
            continue;
        };
        let mut k = kernel.clone();
        let mut dumps = Vec::new();
        run_pipeline(&mut k, Target::Sm90a, &mut |pass, k| {
            dumps.push((pass.to_string(), print_kernel(k)))
        })
        .expect("pipeline");
        for (pass, text) in dumps {
            s.set_snapshot_path("../snapshots/ir");
            s.bind(|| insta::assert_snapshot!(format!("{name}@sm_90a@{pass}"), text));
        }
        let m = kiln_ptx::compile(&kernel, Target::Sm90a).expect("compile");
        assert_eq!(!m.tensor_maps.is_empty(), tma, "{name}: TMA on sm_90a");
        s.set_snapshot_path("../snapshots/ptx");
        s.bind(|| insta::assert_snapshot!(format!("{name}@sm_90a"), m.ptx));
        let report =
            kiln_ptx::ptxas::check(&m.ptx, Target::Sm90a).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(!report.spills(), "{name} on sm_90a spills: {report}");
        assert!(
            report.warnings.is_empty(),
            "{name} on sm_90a: ptxas advisories (wgmma serialisation?): {report}"
        );
    }
}

#[test]
fn ir_and_ptx_snapshots_assemble() {
    if let Err(e) = kiln_ptx::ptxas::find_ptxas() {
        panic!("{e}");
    }
    let under = |sub: &str| {
        let mut s = insta::Settings::clone_current();
        s.set_snapshot_path(format!("../snapshots/{sub}"));
        s.set_prepend_module_to_snapshot(false);
        s
    };
    {
        for (name, kernel) in ptx_examples::all() {
            let mut k = kernel.clone();
            let mut dumps = Vec::new();
            run_pipeline(&mut k, Target::Sm80, &mut |pass, k| {
                dumps.push((pass.to_string(), print_kernel(k)))
            })
            .expect("pipeline");
            for (pass, text) in dumps {
                under("ir").bind(|| insta::assert_snapshot!(format!("{name}@{pass}"), text));
            }
            let m = kiln_ptx::compile(&kernel, Target::Sm80).expect("compile");
            under("ptx").bind(|| insta::assert_snapshot!(format!("{name}@sm_80"), m.ptx));

            let report = kiln_ptx::ptxas::check(&m.ptx, Target::Sm80)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let (spills, regs) = (report.spill_store_bytes, report.registers);
            let expected = KNOWN_SPILLS
                .iter()
                .find(|(k, _)| *k == name)
                .map_or(0, |(_, n)| *n);
            assert_eq!(
                spills, expected,
                "{name}: ptxas reports {spills} bytes of spill stores ({regs} registers), \
                 expected {expected}"
            );
        }
    }
}
