//! Differential check on the CPU: for every variant of the sm_80 subset, both backends'
//! PTX (kiln-ptx's and LLVM's NVPTX output through kiln-llvm) assembles with ptxas for
//! sm_80, and both entries take the same parameters and launch the same way.

#![cfg(feature = "llvm")]

mod common;

use common::Variant;
use kiln::ir::Target;
use kiln_examples::gemm::GemmComptime;
use kiln_examples::softmax::SoftmaxComptime;
use kiln_ptx::ptxas;

/// The `.param` types of the entry of `ptx`, in order (`u64`, `u32`, `u64`, `f32`, ...).
/// LLVM spells a signed slot `.u32` / `.u64` where kiln-ptx writes `.s32` / `.s64`: the
/// same widths, which is all the driver packs by.
fn param_widths(ptx: &str) -> Vec<String> {
    let start = ptx.find(".entry").expect("an entry");
    let end = start + ptx[start..].find(')').expect("closed parameter list");
    ptx[start..end]
        .lines()
        .filter_map(|l| l.trim().strip_prefix(".param "))
        .map(|p| {
            let ty = p.split_whitespace().next().unwrap_or("");
            match ty {
                ".s32" | ".u32" | ".b32" => "32".to_string(),
                ".s64" | ".u64" | ".b64" => "64".to_string(),
                other => other.to_string(),
            }
        })
        .collect()
}

#[test]
fn both_backends_assemble_with_ptxas_for_sm80() {
    for (name, variant, aligned) in common::variants() {
        let k = variant.kernel(aligned);
        let native =
            kiln_ptx::compile(&k, Target::Sm80).unwrap_or_else(|e| panic!("{name}: kiln-ptx: {e}"));
        let llvm = kiln_llvm::compile(&k).unwrap_or_else(|e| panic!("{name}: kiln-llvm: {e}"));
        let m = &llvm.ptx;
        assert!(m.ptx.contains(".target sm_80"), "{name}: {}", m.ptx);
        assert_eq!(m.entry, native.entry, "{name}");
        assert_eq!(m.threads_per_block, native.threads_per_block, "{name}");
        assert_eq!(m.dynamic_smem_bytes, native.dynamic_smem_bytes, "{name}");
        assert_eq!(
            param_widths(&m.ptx),
            param_widths(&native.ptx),
            "{name}: the entries' parameters differ"
        );
        for (backend, ptx) in [("kiln-ptx", &native.ptx), ("kiln-llvm", &m.ptx)] {
            let report = ptxas::check(ptx, Target::Sm80)
                .unwrap_or_else(|e| panic!("{name}: ptxas rejects {backend}'s PTX: {e}"));
            println!("{name:22} {backend:9} {report}");
        }
    }
}

#[test]
fn gemm_goes_through_nvvm_mma_and_ldmatrix_intrinsics() {
    for (b_col_major, ldmatrix_b) in [
        (false, "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"),
        (true, "ldmatrix.sync.aligned.m8n8.x4.shared.b16"),
    ] {
        let c = GemmComptime {
            b_col_major,
            ..GemmComptime::default()
        };
        let m = kiln_llvm::compile(&Variant::Gemm(c).kernel(true)).expect("compiles");
        assert!(m.llvm_ir.contains("@llvm.nvvm.mma.m16n8k16.row.col.bf16"));
        assert!(m.llvm_ir.contains("@llvm.nvvm.barrier0"));
        assert!(m.llvm_ir.contains("!\"kernel\""));
        assert!(
            m.ptx
                .ptx
                .contains("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32")
        );
        assert!(
            m.ptx.ptx.contains(ldmatrix_b),
            "b_col_major = {b_col_major}"
        );
        assert!(!m.llvm_ir.contains(" asm "), "no inline asm");
    }
    let f16 = Variant::Gemm(common::f16_gemm()).kernel(true);
    let m = kiln_llvm::compile(&f16).expect("f16");
    assert!(
        m.llvm_ir
            .contains("@llvm.nvvm.mma.m16n8k16.row.col.f32.f32")
    );
    assert!(
        m.ptx
            .ptx
            .contains("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32")
    );
}

#[test]
fn softmax_reduces_with_warp_shuffles() {
    let softmax = Variant::Softmax(SoftmaxComptime::default()).kernel(true);
    let m = kiln_llvm::compile(&softmax).expect("compiles");
    assert!(m.llvm_ir.contains("@llvm.nvvm.shfl.sync.bfly.f32"));
    assert!(m.ptx.ptx.contains("shfl.sync.bfly.b32"));
    assert!(m.ptx.ptx.contains("ex2.approx"));
}

/// The kernel [`both_backends_write_scalar_loads_and_bounded_stores`] compiles.
mod sequence_rows {
    use kiln::prelude::*;

    /// Sequence `block_id().x`'s rows `cu[b]..cu[b + 1]` of `x`, up to 16 of them, copied
    /// into `out`: a scalar load from an i32 tensor and a store bounded at a runtime row.
    #[kernel]
    pub fn copy_sequence_rows(x: Tensor<f32, 2>, cu: Tensor<i32, 1>, out: TensorMut<f32, 2>) {
        let b = block_id().x;
        let (start, end) = (cu.scalar([b]), cu.scalar([b + 1]));
        let rows = x.tile([16, 8], [start, 0]).load();
        out.tile([16, 8], [start, 0]).store_bounded(rows, 0, end);
    }
}

#[test]
fn both_backends_write_scalar_loads_and_bounded_stores() {
    use kiln::ir::dsl::{KernelDef, Spec};
    let k = sequence_rows::copy_sequence_rows
        .build(&Spec::new(()))
        .expect("builds");
    let native = kiln_ptx::compile(&k, Target::Sm80).expect("kiln-ptx");
    let llvm = kiln_llvm::compile(&k).expect("kiln-llvm");
    for (backend, ptx) in [("kiln-ptx", &native.ptx), ("kiln-llvm", &llvm.ptx.ptx)] {
        // The offsets are 32-bit global loads (the tile's elements are f32 ones; kiln-ptx reads
        // a tensor the kernel never writes through the read-only path).
        let offset_load = ["ld.global.b32", "ld.global.u32", "ld.global.nc.b32"]
            .iter()
            .any(|l| ptx.contains(l));
        assert!(offset_load, "{backend}: no offset load in\n{ptx}");
        ptxas::check(ptx, Target::Sm80)
            .unwrap_or_else(|e| panic!("ptxas rejects {backend}'s PTX: {e}"));
    }
}

/// The kernel [`memory_ops_are_reported_at_the_users_line`] compiles.
mod histogram {
    use kiln::prelude::*;

    /// `h[x[i]] += 1`: an atomic through an index tile, which this backend does not lower.
    #[kernel]
    pub fn histogram(x: Tensor<i32, 1>, h: TensorMut<i32, 1>) {
        let bins = x.tile([128], [block_id().x * 128]).load();
        h.elems([&bins]).atomic_add(1);
    }
}

#[test]
fn memory_ops_are_reported_at_the_users_line() {
    use kiln::ir::dsl::{KernelDef, Spec};
    let k = histogram::histogram.build(&Spec::new(())).expect("builds");
    let err = match kiln_llvm::compile(&k) {
        Ok(_) => panic!("kiln-llvm compiled an atomic"),
        Err(e) => e,
    };
    let kiln_llvm::LlvmError::Diagnostic(d) = &err else {
        panic!("not a diagnostic: {err}");
    };
    let src = include_str!("ptxas.rs");
    let line = src
        .lines()
        .position(|l| l.contains("h.elems([&bins]).atomic_add(1);"))
        .expect("the kernel's line") as u32
        + 1;
    assert_eq!(d.loc.line, line, "{err}");
    assert!(
        d.message
            .contains("atomics are not supported by the LLVM backend"),
        "{err}"
    );
    // The PTX backend writes it.
    kiln_ptx::compile(&k, Target::Sm80).expect("kiln-ptx");
}

#[test]
fn ops_beyond_the_subset_are_errors_at_the_users_line() {
    use kiln::ir::dsl::{KernelDef, Spec};
    use kiln::prelude::*;

    #[kernel(grid = [256, 1, 1])]
    fn uses_sin(x: Tensor<f32, 1>, y: TensorMut<f32, 1>) {
        let v = x.tile([256], [block_id().x * 256]).load();
        y.tile([256], [block_id().x * 256]).store(sin(v));
    }
    #[kernel(grid = [256, 1, 1])]
    fn uses_u32(x: Tensor<u32, 1>, y: TensorMut<u32, 1>) {
        let v = x.tile([256], [block_id().x * 256]).load();
        y.tile([256], [block_id().x * 256]).store(v ^ 7);
    }
    for (def, what) in [
        (&uses_sin as &dyn KernelDef<Comptime = ()>, "sin, cos"),
        (&uses_u32, "a u32 value"),
    ] {
        let k = def
            .build(&Spec::uniform((), def.signature(), false))
            .expect("builds");
        let err = kiln_llvm::compile(&k)
            .expect_err("beyond the subset")
            .to_string();
        assert!(err.contains(what), "{}: {err}", def.name());
        assert!(
            err.contains("codegen-llvm/tests/ptxas.rs:"),
            "{}: {err}",
            def.name()
        );
        assert!(err.contains("the LLVM backend cannot lower"), "{err}");
    }
}

#[test]
fn tiles_of_more_dimensions_and_moving_reshapes_are_errors_at_the_users_line() {
    use kiln::ir::dsl::{KernelDef, Spec};
    use kiln::prelude::*;

    #[kernel(grid = [4, 1, 1])]
    fn loads_3d(x: Tensor<f32, 3>, y: TensorMut<f32, 3>) {
        let v = x.tile([4, 8, 32], [block_id().x * 4, 0, 0]).load();
        y.tile([4, 8, 32], [block_id().x * 4, 0, 0]).store(v);
    }
    #[kernel(grid = [64, 1, 1])]
    fn permutes(x: Tensor<f32, 2>, y: TensorMut<f32, 2>) {
        let v = x.tile([64, 32], [block_id().x * 64, 0]).load();
        y.tile([32, 64], [0, block_id().x * 64])
            .store(v.permute([1, 0]));
    }
    for (def, what) in [
        (
            &loads_3d as &dyn KernelDef<Comptime = ()>,
            "tiles of 3 or more dimensions",
        ),
        (&permutes, "a permutation of a tile's dimensions"),
    ] {
        let k = def
            .build(&Spec::uniform((), def.signature(), false))
            .expect("builds");
        let err = kiln_llvm::compile(&k)
            .expect_err("beyond the subset")
            .to_string();
        assert!(err.contains(what), "{}: {err}", def.name());
        assert!(
            err.contains("codegen-llvm/tests/ptxas.rs:"),
            "{}: {err}",
            def.name()
        );
        // The PTX backend writes it.
        kiln_ptx::compile(&k, Target::Sm80).expect("kiln-ptx");
    }
}

/// A reshape both backends agree on: where the layouts keep every element in its register
/// the LLVM backend hands them on as the PTX backend does; where the PTX backend moves them
/// through shared memory the LLVM backend reports it at the user's line.
#[test]
fn reshapes_lower_alike_or_are_errors_at_the_users_line() {
    use kiln::ir::dsl::{KernelDef, Spec};
    use kiln::prelude::*;

    #[kernel(grid = [64, 1, 1])]
    fn to_wide(x: Tensor<f32, 2>, y: TensorMut<f32, 2>) {
        let v = x.tile([64, 32], [block_id().x * 64, 0]).load();
        y.tile([32, 64], [block_id().x * 32, 0])
            .store(v.reshape([32, 64]));
    }
    #[kernel(grid = [64, 1, 1])]
    fn to_narrow(x: Tensor<f32, 2>, y: TensorMut<f32, 2>) {
        let v = x.tile([64, 32], [block_id().x * 64, 0]).load();
        y.tile([1024, 2], [block_id().x * 1024, 0])
            .store(v.reshape([1024, 2]));
    }
    #[kernel(grid = [8, 1, 1])]
    fn to_flat(x: Tensor<f32, 2>, y: TensorMut<f32, 1>) {
        let v = x.tile([8, 128], [block_id().x * 8, 0]).load();
        y.tile([1024], [block_id().x * 1024])
            .store(v.reshape([1024]));
    }
    let mut moved = 0;
    for def in [
        &to_wide as &dyn KernelDef<Comptime = ()>,
        &to_narrow,
        &to_flat,
    ] {
        let k = def
            .build(&Spec::uniform((), def.signature(), false))
            .expect("builds");
        let ptx = kiln_ptx::compile(&k, Target::Sm80).expect("kiln-ptx").ptx;
        let moves = ptx.contains("layout conversion through shared memory");
        match kiln_llvm::compile(&k) {
            Ok(m) => {
                assert!(
                    !moves,
                    "{}: LLVM handed on a reshape that moves",
                    def.name()
                );
                ptxas::check(&m.ptx.ptx, Target::Sm80).expect("ptxas");
            }
            Err(e) => {
                let e = e.to_string();
                assert!(moves, "{}: {e}", def.name());
                assert!(e.contains("a reshape that moves elements"), "{e}");
                assert!(e.contains("codegen-llvm/tests/ptxas.rs:"), "{e}");
                moved += 1;
            }
        }
    }
    // `[64, 32] -> [1024, 2]`: two elements a thread instead of four.
    assert!(moved >= 1, "no reshape moved its elements");
}
