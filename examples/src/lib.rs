//! Kernels written in the kiln DSL. [`registry`] lists them for the CLI and the tests.
//!
//! **Architecture invariant:** an example uses only the public `kiln` facade, as a user's
//! crate would; nothing here reaches into a member crate's internals.

use kiln::ir::dsl::KernelDef;

pub mod attention;
pub mod gemm;
pub mod softmax;
pub mod vector_add;

/// Every example kernel, by name: `vector_add`, `softmax`, `gemm`, `attention`.
pub fn registry() -> &'static [&'static dyn KernelDef] {
    &[
        &vector_add::vector_add,
        &softmax::softmax,
        &gemm::gemm,
        &attention::attention,
    ]
}

/// The example kernel called `name`, if there is one.
pub fn find(name: &str) -> Option<&'static dyn KernelDef> {
    registry().iter().copied().find(|k| k.name() == name)
}

#[cfg(test)]
mod tests {
    use kiln::ir::dsl::Spec;

    use super::registry;

    #[test]
    fn every_kernel_builds_with_its_defaults() {
        let names: Vec<&str> = registry().iter().map(|k| k.name()).collect();
        assert_eq!(names, ["vector_add", "softmax", "gemm", "attention"]);
        assert!(super::find("gemm").is_some_and(|k| k.name() == "gemm"));
        assert!(super::find("nope").is_none());
        for k in registry() {
            let spec = Spec::from_defaults(*k, &[]).unwrap_or_else(|e| panic!("{e}"));
            k.build(&spec)
                .unwrap_or_else(|d| panic!("{} does not build: {d}", k.name()));
        }
    }
}
