//! Kernels written in the kiln DSL. [`registry`] lists them for the CLI and the tests.

use kiln::ir::dsl::KernelDef;

pub mod vector_add;

/// Every example kernel, by name: `vector_add`, `softmax`, `gemm`, `attention`.
pub fn registry() -> &'static [&'static dyn KernelDef] {
    &[&vector_add::vector_add]
}
