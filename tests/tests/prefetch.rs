//! The `prefetch` pass: a `pipelined(.., stages = n)` loop without an `mma` reads its loads
//! `n - 1` iterations ahead through per-thread rings in shared memory. The loop plans name the
//! loads that move and only those, `memory_plan` places their rings (loops one after another
//! sharing their bytes), the PTX copies them with `cp.async` and assembles without spills;
//! loops whose loads cannot move get no plan. `gpu_prefetch` and `gpu_library` run them.

mod prefetch_kernels;

use kiln_examples::cross_entropy::{CrossEntropyComptime, cross_entropy};
use kiln_examples::norm_backward::{LayerNormBackwardComptime, layer_norm_backward};
use kiln_ir::dsl::{KernelDef, Spec};
use kiln_ir::passes::run_through;
use kiln_ir::print::print_kernel;
use kiln_ir::{DType, Kernel, OpKind, Target};
use kiln_tests::codegen::assembles_clean;
use prefetch_kernels::*;

/// What every thread's copies into a ring look like in the PTX.
const RING_COPY: &str = "cp.async.cg.shared.global";

/// `k` after the passes up to and including `last`.
fn through(k: &Kernel, target: Target, last: &str) -> Kernel {
    let mut k = k.clone();
    run_through(&mut k, target, last).unwrap_or_else(|d| panic!("{last}: {d}"));
    k
}

fn build<D: KernelDef>(def: &D, c: D::Comptime) -> Kernel {
    def.build(&Spec::uniform(c, def.signature(), false))
        .unwrap_or_else(|d| panic!("{}: {d}", def.name()))
}

/// Per loop plan of `k` (after `lower`): its stages and the tensors its prefetched loads read,
/// each with the stages of its ring.
fn plans(k: &Kernel) -> Vec<(u32, Vec<(String, u32)>)> {
    k.schedule
        .loops
        .values()
        .map(|plan| {
            let loads = plan
                .prefetched
                .iter()
                .map(|&l| {
                    let OpKind::Load { tensor, .. } = k.ops[l].kind else {
                        panic!("{l} is not a load");
                    };
                    let ring = k.schedule.slab(l).unwrap_or_else(|| panic!("{l}: no ring"));
                    (k.params[tensor].name().to_string(), ring.stages)
                })
                .collect();
            (plan.stages, loads)
        })
        .collect()
}

/// Asserts that `k`'s one loop plan reads the tiles of `x`, and only those, `stages` deep.
fn reads_x_ahead(k: &Kernel, stages: usize) {
    let s = stages as u32;
    let want = vec![(s, vec![("x".to_string(), s)])];
    assert_eq!(plans(k), want, "{}", print_kernel(k));
}

#[test]
fn cross_entropy_reads_its_tiles_ahead_through_rings() {
    for stages in [2, 3] {
        for dtype in [DType::Bf16, DType::F32] {
            let c = CrossEntropyComptime {
                BM: 2,
                BN: 256,
                NW: 2,
                STAGES: stages,
                dtype,
            };
            let k = build(&cross_entropy, c);
            for target in [Target::Sm80, Target::Sm90a] {
                reads_x_ahead(&through(&k, target, "lower"), stages);
            }
            assembles_clean(&cross_entropy, c, RING_COPY);
        }
    }
}

#[test]
fn a_window_of_columns_reads_only_what_moves_ahead() {
    for stages in [2, 3, 4] {
        let c = ShiftedWindowComptime {
            BM: 2,
            BN: 32,
            STAGES: stages,
        };
        let k = build(&shifted_window, c);
        // `x` read ahead, `w` (the same tile each iteration) where it was.
        reads_x_ahead(&through(&k, Target::Sm80, "lower"), stages);
        // Its column coordinate is known only at run time: where a thread's 16 bytes are
        // not aligned, its elements are copied one by one.
        assembles_clean(&shifted_window, c, "cp.async.ca.shared.global");
    }
}

/// Layer norm's backward walks a long row twice, one loop after the other: the second
/// loop's rings take the bytes of the first's.
#[test]
fn loops_one_after_another_share_their_rings() {
    let c = LayerNormBackwardComptime {
        BM: 1,
        BN: 4096,
        RB: 8,
        NW: 16,
        OCC: 1,
        STAGES: 2,
        LC: 0,
        dtype: DType::Bf16,
    };
    let k = through(&build(&layer_norm_backward, c), Target::Sm90a, "lower");
    let long: Vec<_> = k
        .schedule
        .loops
        .iter()
        .filter(|(_, plan)| plan.prefetched.len() == 3)
        .map(|(_, plan)| {
            plan.prefetched
                .iter()
                .map(|&l| k.schedule.slab(l).expect("a ring").offset)
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(long.len(), 2, "{}", print_kernel(&k));
    assert_eq!(long[0], long[1], "{}", print_kernel(&k));
    let end = k
        .schedule
        .slabs
        .iter()
        .map(|b| b.offset + b.stages * b.stage_bytes)
        .max();
    let sum: u32 = k
        .schedule
        .slabs
        .iter()
        .map(|b| b.stages * b.stage_bytes)
        .sum();
    assert!(end < Some(sum), "{}", print_kernel(&k));
    assembles_clean(&layer_norm_backward, c, RING_COPY);
}

#[test]
fn loads_that_cannot_move_stay() {
    let cases: [(&str, Kernel); 3] = [
        ("carried_offsets", build(&carried_offsets, ())),
        ("doubled_in_place", build(&doubled_in_place, ())),
        ("counted_positives", build(&counted_positives, ())),
    ];
    for (name, k) in cases {
        for target in [Target::Sm80, Target::Sm90a] {
            let p = through(&k, target, "lower");
            assert!(p.schedule.loops.is_empty(), "{name} on {target}");
            assert!(p.schedule.slabs.is_empty(), "{name} on {target}");
            let ptx = kiln_ptx::compile(&k, target).expect("compile").ptx;
            assert!(!ptx.contains("cp.async"), "{name} on {target}:\n{ptx}");
        }
    }
}
