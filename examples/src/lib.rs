//! Kernels written in the kiln DSL. [`registry`] lists them for the CLI and the tests.
//!
//! **Architecture invariant:** an example uses only the public `kiln` facade, as a user's
//! crate would; nothing here reaches into a member crate's internals.

use kiln::ir::dsl::{KernelDef, Spec};

pub mod attention;
pub mod gemm;
pub mod gemm_epilogue;
pub mod softmax;
pub mod vector_add;

/// Every example kernel, by name: `vector_add`, `softmax`, `gemm`, `gemm_bias_act`,
/// `gemm_alpha_beta`, `attention`, `attention_lse`, `attention_varlen`, `attention_varlen_lse`.
pub fn registry() -> &'static [&'static dyn KernelDef] {
    &[
        &vector_add::vector_add,
        &softmax::softmax,
        &gemm::gemm,
        &gemm_epilogue::gemm_bias_act,
        &gemm_epilogue::gemm_alpha_beta,
        &attention::attention,
        &attention::attention_lse,
        &attention::attention_varlen,
        &attention::attention_varlen_lse,
    ]
}

/// The example kernel called `name`, if there is one.
pub fn find(name: &str) -> Option<&'static dyn KernelDef> {
    registry().iter().copied().find(|k| k.name() == name)
}

/// Example `name` and its spec: `overrides` on its comptime defaults, every tensor's
/// `aligned16` set to `aligned` (as the tests and the CLI compile a kernel without
/// arguments to take alignments from); why not, when there is no such kernel or an override
/// is wrong.
pub fn spec(
    name: &str,
    overrides: &[(&str, &str)],
    aligned: bool,
) -> Result<(&'static dyn KernelDef, Spec), String> {
    let def = find(name).ok_or_else(|| format!("no example kernel `{name}`"))?;
    let o: Vec<(String, String)> = overrides
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let mut spec = Spec::from_defaults(def, &o).map_err(|e| format!("{name}: {e}"))?;
    for a in spec.aligned16.values_mut() {
        *a = aligned;
    }
    Ok((def, spec))
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
                "attention",
                "attention_lse",
                "attention_varlen",
                "attention_varlen_lse"
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
