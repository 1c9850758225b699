//! Kernels written in the kiln DSL. [`registry`] lists them for the CLI and the tests.
//!
//! **Architecture invariant:** an example uses only the public `kiln` facade, as a user's
//! crate would; nothing here reaches into a member crate's internals.

use kiln::ir::dsl::KernelDef;

pub mod attention;
pub mod gemm;
pub mod gemm_epilogue;
pub mod softmax;
pub mod vector_add;

/// Every example kernel, by name: `vector_add`, `softmax`, `gemm`, `gemm_bias_act`,
/// `gemm_alpha_beta`, `attention`.
pub fn registry() -> &'static [&'static dyn KernelDef] {
    &[
        &vector_add::vector_add,
        &softmax::softmax,
        &gemm::gemm,
        &gemm_epilogue::gemm_bias_act,
        &gemm_epilogue::gemm_alpha_beta,
        &attention::attention,
    ]
}

/// The example kernel called `name`, if there is one.
pub fn find(name: &str) -> Option<&'static dyn KernelDef> {
    registry().iter().copied().find(|k| k.name() == name)
}

#[cfg(test)]
mod tests {
    use super::{find, registry, testing};

    #[test]
    fn every_kernel_builds_with_its_defaults() {
        let names: Vec<&str> = registry().iter().map(|k| k.name()).collect();
        assert_eq!(
            names,
            [
                "vector_add",
                "softmax",
                "gemm",
                "gemm_bias_act",
                "gemm_alpha_beta",
                "attention"
            ]
        );
        assert!(find("gemm").is_some_and(|k| k.name() == "gemm"));
        assert!(find("nope").is_none());
        for k in registry() {
            testing::build(*k, &[]);
        }
    }
}

/// What the kernels' unit tests share.
#[cfg(test)]
mod testing {
    use kiln::ir::dsl::{KernelDef, Spec};
    use kiln::ir::print::print_kernel;
    use kiln::ir::{Kernel, OpKind};

    /// `def` built with its comptime defaults overridden by `overrides` (as `-D name=value`);
    /// the IR is printed, so `--nocapture` shows it. Panics with the diagnostic otherwise.
    pub(crate) fn build(def: &dyn KernelDef, overrides: &[(&str, &str)]) -> Kernel {
        let o: Vec<(String, String)> = overrides
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        let spec = Spec::from_defaults(def, &o).unwrap_or_else(|e| panic!("{e}"));
        let k = def
            .build(&spec)
            .unwrap_or_else(|d| panic!("{} does not build: {d}", def.name()));
        println!("{}", print_kernel(&k));
        k
    }

    /// The kinds of the ops of `k`'s top-level block, in order.
    pub(crate) fn top_level(k: &Kernel) -> Vec<&OpKind> {
        k.body.ops.iter().map(|&o| &k.ops[o].kind).collect()
    }

    /// The `stages` of each top-level `for` of `k`.
    pub(crate) fn loop_stages(k: &Kernel) -> Vec<Option<u32>> {
        top_level(k)
            .into_iter()
            .filter_map(|kind| match kind {
                OpKind::For { stages } => Some(*stages),
                _ => None,
            })
            .collect()
    }
}
