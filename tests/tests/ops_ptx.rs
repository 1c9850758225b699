//! The new ops through the PTX writer and ptxas for sm_80 and sm_90a: every kernel of
//! `ops_kernels` and the dropout example (each dtype) assemble without spills or warnings, by
//! the pinned ptxas and by the driver release's (`$KILN_PTXAS_JIT`), and the code stays
//! compact: the dropout kernel's PTX grows with the elements each thread holds, not with the
//! tile (Philox is a fixed sequence per four elements), and it moves no element through
//! shared memory.
mod ops_kernels;

use kiln::ir::Target;
use kiln::ir::dsl::{Comptime, KernelDef, Spec};
use kiln::ir::{DType, Kernel};
use kiln::ptx::ptxas::Tool;
use kiln_examples::dropout::{DropoutComptime, dropout};
use ops_kernels::*;

fn build<C: Comptime>(def: &dyn KernelDef<Comptime = C>, c: C) -> Kernel {
    def.build(&Spec::uniform(c, def.signature(), false))
        .unwrap_or_else(|e| panic!("{}: {e}", def.name()))
}

fn kernels() -> Vec<(&'static str, Kernel)> {
    vec![
        (
            "philox_words",
            build(&philox_words, PhiloxWordsComptime { BLOCK: 512 }),
        ),
        (
            "rand_draws",
            build(&rand_draws, RandDrawsComptime { BLOCK: 512 }),
        ),
        (
            "transcendentals",
            build(&transcendentals, TranscendentalsComptime { BLOCK: 256 }),
        ),
        ("u32_ops", build(&u32_ops, U32OpsComptime { BLOCK: 256 })),
        ("i32_ops", build(&i32_ops, I32OpsComptime { BLOCK: 256 })),
        ("casts", build(&casts, CastsComptime { BLOCK: 256 })),
        (
            "rand4x_draws",
            build(&rand4x_draws, Rand4xDrawsComptime { BLOCK: 512 }),
        ),
        ("dropout", build(&dropout, DropoutComptime::default())),
        (
            "dropout bf16",
            build(
                &dropout,
                DropoutComptime {
                    dtype: DType::Bf16,
                    ..DropoutComptime::default()
                },
            ),
        ),
        (
            "dropout f16",
            build(
                &dropout,
                DropoutComptime {
                    dtype: DType::F16,
                    ..DropoutComptime::default()
                },
            ),
        ),
        (
            "takes",
            build(
                &takes,
                TakesComptime {
                    R: 32,
                    C: 64,
                    K: 16,
                },
            ),
        ),
        (
            "sort_by_key",
            build(&sort_by_key, SortByKeyComptime { N: 64 }),
        ),
        (
            "takes 64x32",
            build(
                &takes,
                TakesComptime {
                    R: 64,
                    C: 32,
                    K: 128,
                },
            ),
        ),
    ]
}

#[test]
fn every_op_kernel_assembles_without_spills() {
    for (name, k) in kernels() {
        for target in [Target::Sm80, Target::Sm90a] {
            let m = kiln::ptx::compile(&k, target).unwrap_or_else(|e| panic!("{name}: {e}"));
            // The pinned ptxas and the driver's (which JIT-compiles this PTX on the GPU host).
            for tool in [Tool::Ptxas, Tool::JitPtxas] {
                let report = kiln::ptx::ptxas::check_with(tool, &m.ptx, target)
                    .unwrap_or_else(|e| panic!("{name} on {target} ({tool:?}): {e}"));
                assert!(!report.spills(), "{name} on {target} ({tool:?}): {report}");
                assert!(
                    report.warnings.is_empty(),
                    "{name} on {target} ({tool:?}): {report}"
                );
            }
        }
    }
}

/// Instruction lines of a PTX module (no declarations, labels, braces or comments).
fn instructions(ptx: &str) -> usize {
    ptx.lines()
        .map(str::trim)
        .filter(|l| l.ends_with(';') && !l.starts_with('.') && !l.starts_with("//"))
        .count()
}

#[test]
fn dropout_ptx_grows_with_elements_per_thread_only() {
    for dtype in [DType::F32, DType::Bf16, DType::F16] {
        let lines = |block: usize| {
            let k = build(
                &dropout,
                DropoutComptime {
                    BLOCK: block,
                    dtype,
                },
            );
            let m = kiln::ptx::compile(&k, Target::Sm80).unwrap();
            let per_thread = block / m.threads_per_block as usize;
            // The tile's rows of one vector are the load's: no element moves between threads.
            assert_eq!(m.dynamic_smem_bytes, 0, "dropout {dtype:?} BLOCK={block}");
            // Philox4x32-10 multiplies twice a round (`mul.hi`, ten rounds), a few of them on
            // the key alone (scalars): one call per four elements a thread.
            let mulhi = m.ptx.matches("mul.hi.u32").count();
            assert!(
                mulhi <= 20 * per_thread / 4,
                "dropout {dtype:?} BLOCK={block}: {mulhi} mul.hi for {per_thread} elements a thread"
            );
            (instructions(&m.ptx), per_thread)
        };
        let (small, per_small) = lines(1024);
        let (large, per_large) = lines(2048);
        println!("dropout {dtype:?}: {small} instructions at BLOCK=1024, {large} at BLOCK=2048");
        // A 1024-element tile is a few hundred to a few thousand lines, not tens of thousands.
        assert!(
            small < 2000,
            "dropout {dtype:?} BLOCK=1024: {small} instructions"
        );
        let per_element = (large - small) as f64 / (per_large - per_small).max(1) as f64;
        assert!(
            per_element < 150.0,
            "dropout {dtype:?}: {small} instructions at {per_small} elements per thread, \
             {large} at {per_large}"
        );
    }
}

#[test]
fn transcendentals_are_branch_free_f64_sequences() {
    let k = build(&transcendentals, TranscendentalsComptime { BLOCK: 256 });
    let ptx = kiln::ptx::compile(&k, Target::Sm80).unwrap().ptx;
    assert!(ptx.contains(".const .align 4 .b32 kiln_two_over_pi[9]"));
    assert!(!ptx.contains("sin.approx") && !ptx.contains("cos.approx"));
    // The logarithms are f64 sequences too: lg2.approx's error near 1 is absolute.
    assert!(!ptx.contains("lg2.approx"), "{ptx}");
    // The kernel has no control flow of its own and the functions add none: the only
    // branches are the vector accesses' warp-uniform ones (fast path or edge).
    let divergent = ptx
        .lines()
        .filter(|l| l.contains("bra") && !l.contains("bra.uni"))
        .count();
    assert_eq!(divergent, 0, "{ptx}");
}
