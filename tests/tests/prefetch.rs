//! The `prefetch` pass: a `pipelined(.., stages = n)` loop without an `mma` issues each
//! iteration's loads `n - 1` iterations ahead, their tiles carried around the loop. On the
//! interpreter the rewritten kernel gives the same bits as the kernel as written (shapes no
//! multiple of a tile, loops of no iteration, one, and fewer than the stages, a loop ending
//! before its tensor does) and cross-entropy its f64 reference; loops whose loads cannot
//! move are left as they are; the prefetching kernels assemble without spills.

mod library;

use kiln::prelude::*;
use kiln_examples::cross_entropy::{CrossEntropyComptime, cross_entropy};
use kiln_ir::dsl::{KernelDef, Spec};
use kiln_ir::interp::{HostArg, run};
use kiln_ir::passes::run_through;
use kiln_ir::print::print_kernel;
use kiln_ir::{DType, HostTensor, Kernel, Target};
use kiln_tests::check::{
    Case, assert_close, assert_close_to_terms, lse_terms, poisoned, tolerance,
};
use kiln_tests::codegen::assembles_clean;
use kiln_tests::inputs::{Dist, Rng, tensor};
use kiln_tests::reference;
use library::targets;

/// `y[r, j..j + BN] = 2 w x[r, j + 1..]` and `s[r]` the sum of what was read, for `j` from
/// `lo` to `hi` (a window of the columns, `BN` at a time): a loop that ends before its tensor
/// does and stores another tensor. `w: [BN]` is read again each iteration (the same tile:
/// not read ahead).
#[kernel(grid = [BM, 1, 1])]
#[allow(clippy::too_many_arguments)]
pub fn shifted_window(
    x: Tensor<f32, 2>,
    w: Tensor<f32, 1>,
    y: TensorMut<f32, 2>,
    s: TensorMut<f32, 1>,
    lo: i32,
    hi: i32,
    #[comptime(default = 2)] BM: usize,
    #[comptime(default = 32)] BN: usize,
    #[comptime(default = 2)] STAGES: usize,
) {
    let r0 = block_id().x * BM;
    let mut acc = zeros::<f32>([BM]);
    for j in pipelined((lo..hi).step_by(BN), stages = STAGES as u32) {
        let t = x.tile([BM, BN], [r0, j + 1]).load() * w.tile([BN], [0]).load().row();
        y.tile([BM, BN], [r0, j]).store(t * 2.0);
        acc = acc + row_sum(&t);
    }
    s.tile([BM], [r0]).store(acc);
}

/// A column offset carried around the loop: the next load's coordinates are known only
/// after this iteration, so nothing is prefetched.
#[kernel(grid = [4, 1, 1])]
pub fn carried_offsets(x: Tensor<f32, 2>, s: TensorMut<f32, 1>) {
    let r0 = block_id().x * 4;
    let mut acc = zeros::<f32>([4]);
    let mut at = block_id().x;
    for _ in pipelined((0..x.dim(1)).step_by(16), stages = 2) {
        let t = x.tile([4, 16], [r0, at]).load();
        acc = acc + row_sum(&t);
        at = at + 16;
    }
    s.tile([4], [r0]).store(acc);
}

/// Each tile doubled in place: a load moved before the previous iteration's store could read
/// what that store writes, so nothing is prefetched.
#[kernel(grid = [4, 1, 1])]
pub fn doubled_in_place(x: TensorMut<f32, 2>) {
    let r0 = block_id().x * 4;
    for j in pipelined((0..x.dim(1)).step_by(8), stages = 2) {
        let t = x.tile([4, 16], [r0, j]).load();
        x.tile([4, 16], [r0, j]).store(t * 2.0);
    }
}

/// A count taken with atomics inside the loop: the loads keep their order against them.
#[kernel(grid = [4, 1, 1])]
pub fn counted_positives(x: Tensor<f32, 2>, count: TensorMut<i32, 1>) {
    let r0 = block_id().x * 4;
    for j in pipelined((0..x.dim(1)).step_by(16), stages = 2) {
        let t = x.tile([4, 16], [r0, j]).load();
        count
            .elems([iota([4, 16], 0) * 0])
            .atomic_add_masked(1, t > 0.0);
    }
}

/// `k` after the passes up to and including `last`.
fn through(k: &Kernel, target: Target, last: &str) -> Kernel {
    let mut k = k.clone();
    run_through(&mut k, target, last).unwrap_or_else(|d| panic!("{last}: {d}"));
    k
}

/// `k` after the passes up to and including `prefetch`.
fn prefetched(k: &Kernel, target: Target) -> Kernel {
    through(k, target, "prefetch")
}

fn build<D: KernelDef>(def: &D, c: D::Comptime) -> Kernel {
    def.build(&Spec::uniform(c, def.signature(), false))
        .unwrap_or_else(|d| panic!("{}: {d}", def.name()))
}

/// How many loads of tensor `name` the IR prints.
fn loads_of(k: &Kernel, name: &str) -> usize {
    print_kernel(k).matches(&format!("= load {name}[")).count()
}

#[test]
fn cross_entropy_loads_its_tiles_ahead_and_matches_the_reference() {
    let mut rng = Rng::from_env();
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
                let p = prefetched(&k, target);
                // One load per stage ahead before the loop, one inside it.
                assert_eq!(loads_of(&k, "x"), 1, "{}", print_kernel(&k));
                assert_eq!(loads_of(&p, "x"), stages, "{}", print_kernel(&p));
            }
            let p = prefetched(&k, Target::Sm90a);
            // One column, fewer tiles than stages, one partial tile, and several.
            for (m, v) in [(3, 1), (5, 200), (4, 300), (7, 1000)] {
                for dist in Dist::ALL {
                    let x = tensor(&mut rng, &[m, v], dtype, dist);
                    let t = targets(&mut rng, m, v, 1);
                    let (rl, rlse) = reference::cross_entropy(&x, &t, -100);
                    let grid = cross_entropy.grid(&c, [m, 1, 1]);
                    for (what, kernel) in [("as written", &k), ("prefetched", &p)] {
                        let (mut loss, mut lse) =
                            (poisoned(&[m], DType::F32), poisoned(&[m], DType::F32));
                        let mut args = [
                            HostArg::Tensor(&x),
                            HostArg::Tensor(&t),
                            HostArg::TensorMut(&mut loss),
                            HostArg::TensorMut(&mut lse),
                            HostArg::I32(-100),
                        ];
                        run(kernel, grid, &mut args).expect("interpret");
                        let case = Case {
                            kernel: format!("cross_entropy {dtype} STAGES={stages} {what}"),
                            shape: format!("m={m} n={v}"),
                            dist,
                            seed: rng.seed(),
                        };
                        assert_close(&case, &loss, &rl, tolerance(DType::F32) * 10.0);
                        let terms = lse_terms(&rlse);
                        assert_close_to_terms(&case, &lse, &rlse, &terms, tolerance(DType::F32));
                    }
                }
            }
            assembles_clean(&cross_entropy, c, "");
        }
    }
}

/// Runs `shifted_window` as `kernel` on `x`, `w` over `lo..hi`: `(y, s)`, `y` poisoned first.
fn window(
    kernel: &Kernel,
    c: &ShiftedWindowComptime,
    (x, w): (&HostTensor, &HostTensor),
    lo: i32,
    hi: i32,
) -> (Vec<f64>, Vec<f64>) {
    let (m, n) = (x.shape[0], x.shape[1]);
    let (mut y, mut s) = (poisoned(&[m, n], DType::F32), poisoned(&[m], DType::F32));
    let mut args = [
        HostArg::Tensor(x),
        HostArg::Tensor(w),
        HostArg::TensorMut(&mut y),
        HostArg::TensorMut(&mut s),
        HostArg::I32(lo),
        HostArg::I32(hi),
    ];
    run(kernel, shifted_window.grid(c, [m, 1, 1]), &mut args).expect("interpret");
    (y.to_f64_vec(), s.to_f64_vec())
}

#[test]
fn a_window_of_columns_reads_the_same_bits_ahead() {
    let mut rng = Rng::from_env();
    for stages in [2, 3, 4] {
        let c = ShiftedWindowComptime {
            BM: 2,
            BN: 32,
            STAGES: stages,
        };
        let k = build(&shifted_window, c);
        let p = prefetched(&k, Target::Sm80);
        // `x` read ahead (before the loop and in it), `w` where it was.
        assert_eq!(loads_of(&p, "x"), stages, "{}", print_kernel(&p));
        assert_eq!(loads_of(&p, "w"), 1, "{}", print_kernel(&p));
        let (m, n) = (5, 300);
        // Empty, one iteration, fewer than the stages, ending inside the tensor, and
        // running past its end.
        for (lo, hi) in [(10, 10), (0, 20), (3, 70), (17, 200), (40, 300)] {
            let x = tensor(&mut rng, &[m, n], DType::F32, Dist::Normal);
            let w = tensor(&mut rng, &[c.BN], DType::F32, Dist::Uniform);
            let want = window(&k, &c, (&x, &w), lo, hi);
            let got = window(&p, &c, (&x, &w), lo, hi);
            // Unwritten columns stay NaN in both: compare the bits.
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&got.0),
                bits(&want.0),
                "y, STAGES={stages} lo={lo} hi={hi}"
            );
            assert_eq!(
                bits(&got.1),
                bits(&want.1),
                "s, STAGES={stages} lo={lo} hi={hi}"
            );
        }
        assembles_clean(&shifted_window, c, "");
    }
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
            let before = print_kernel(&through(&k, target, "strip_mine"));
            let after = print_kernel(&prefetched(&k, target));
            assert_eq!(before, after, "{name} on {target}");
        }
    }
}
