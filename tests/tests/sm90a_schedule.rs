//! The sm_90a schedule of the example gemm (B row- and column-major): the `pipeline` pass plans one TMA ring that the
//! `protocol_check` pass accepts, and a deliberately broken copy of that real schedule is
//! rejected with a diagnostic at the user's loop; kernels sm_90a does not schedule yet get a
//! diagnostic, not a panic.

mod ptx_examples;

use kiln_ir::passes::{PASSES, protocol_check};
use kiln_ir::ring::{Bar, Operand, Step};
use kiln_ir::{Kernel, Target};

/// A deliberate break of a ring's protocol.
type Edit = fn(&mut kiln_ir::ring::Ring);

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
        assert_eq!(k.schedule.rings.len(), 1);
        let ring = k.schedule.rings.values().next().expect("one ring");
        assert_eq!((ring.stages, ring.full_count, ring.empty_count), (3, 1, 8));
        let a = &ring.loads[0];
        assert_eq!(
            (a.operand, a.box_dims, a.swizzle),
            (Operand::KMajorA, [128, 64], 128)
        );
        let b = &ring.loads[1];
        assert_eq!((b.operand, b.box_dims, b.swizzle), (operand, b_box, 128));
        assert_eq!(b.tile_bytes(), 128 * 64 * 2);
        let roles = k.schedule.roles.expect("warp roles");
        assert_eq!(roles.threads(), 384);
        protocol_check::run(&mut k, Target::Sm90a).expect("the planned protocol is sound");
    }
}

#[test]
fn broken_real_schedules_are_compiler_errors() {
    let edits: [(&str, Edit); 3] = [
        ("deadlock", |r| {
            r.consumer.retain(|s| !matches!(s, Step::Arrive { .. }))
        }),
        ("transaction bytes", |r| {
            for s in &mut r.producer {
                if let Step::ArriveExpectTx { bytes, .. } = s {
                    *bytes += 16;
                }
            }
        }),
        ("must start at 1", |r| {
            r.producer[0] = Step::Wait {
                bar: Bar::Empty,
                start: 0,
            }
        }),
    ];
    for (expect, edit) in edits {
        for b_col_major in ["false", "true"] {
            let mut k = scheduled(&ptx_examples::build(
                "gemm",
                &[("b_col_major", b_col_major)],
            ));
            for r in k.schedule.rings.values_mut() {
                edit(r);
            }
            let d = protocol_check::run(&mut k, Target::Sm90a).expect_err(expect);
            let text = d.to_string();
            assert!(text.contains(expect), "{expect}: {text}");
            assert!(text.contains("examples/src/gemm.rs"), "{text}");
        }
    }
}

#[test]
fn unscheduled_kernels_get_a_diagnostic() {
    for (kernel, overrides) in [
        ("attention", &[][..]),
        ("gemm", &[("BM", "64"), ("BN", "64"), ("BK", "64")][..]),
    ] {
        let k = ptx_examples::build(kernel, overrides);
        let e = kiln_ptx::compile(&k, Target::Sm90a).expect_err("not scheduled on sm_90a yet");
        assert!(e.to_string().contains("sm_90a"), "{kernel}: {e}");
    }
}
