//! Kernels written in the kiln DSL. [`registry`] lists them for the CLI and the tests: each
//! `#[kernel]` registers itself, so a new example needs no list edited.
//!
//! **Architecture invariant:** an example uses only the public `kiln` facade, as a user's
//! crate would; nothing here reaches into a member crate's internals.

use std::sync::OnceLock;

use kiln::ir::Kernel;
use kiln::ir::dsl::AnyKernelDef;
use kiln::ir::dsl::registry::registered;

pub mod attention;
pub mod attention_backward;
pub mod attention_decode;
pub mod cross_entropy;
pub mod dropout;
pub mod gemm;
pub mod gemm_epilogue;
pub mod histogram;
pub mod layer_norm;
pub mod moe;
pub mod norm_backward;
pub mod rms_norm;
pub mod rotary;
pub mod rows;
pub mod softmax;
pub mod vector_add;

/// Every example kernel, ordered by name: the kernels this crate registers (one per
/// `#[kernel]` in its modules), and none of the other crates linked beside it.
pub fn registry() -> &'static [&'static dyn AnyKernelDef] {
    static EXAMPLES: OnceLock<Vec<&'static dyn AnyKernelDef>> = OnceLock::new();
    EXAMPLES.get_or_init(|| {
        registered()
            .iter()
            .filter(|k| k.crate_name() == module_path!())
            .map(|k| k.def())
            .collect()
    })
}

/// The example kernel called `name`, if there is one.
pub fn find(name: &str) -> Option<&'static dyn AnyKernelDef> {
    registry().iter().copied().find(|k| k.name() == name)
}

/// Example `name` built with `defines` (`-D NAME=VALUE` pairs, as the CLI takes them) on its
/// comptime defaults, every tensor taken as 16-byte aligned or not by `aligned` (as the tests
/// and the CLI build a kernel without arguments to take alignments from); why not, when there
/// is no such kernel, a define is wrong or the kernel does not build.
pub fn build(name: &str, defines: &[(&str, &str)], aligned: bool) -> Result<Kernel, String> {
    let def = find(name).ok_or_else(|| format!("no example kernel `{name}`"))?;
    def.build_defines(&owned(defines), aligned)
        .map_err(|e| e.to_string())
}

/// `defines` as the owned pairs [`AnyKernelDef::build_defines`] takes.
pub fn owned(defines: &[(&str, &str)]) -> Vec<(String, String)> {
    defines
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{find, registry};

    /// The kernels `#[kernel]` declares in `src/`, read from the source text: each
    /// `#[kernel]` or `#[kernel(..)]` line and the `fn NAME` after it.
    fn declared_in_source() -> Vec<String> {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir).expect("src/") {
            let path = entry.expect("entry").path();
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("source");
            let mut lines = text.lines().map(str::trim);
            while let Some(line) = lines.next() {
                if line == "#[kernel]" || line.starts_with("#[kernel(") {
                    let name = lines
                        .find_map(|l| l.split_once("fn ").map(|(_, rest)| rest))
                        .and_then(|rest| rest.split(['(', '<']).next())
                        .unwrap_or_else(|| panic!("no fn after {line} in {}", path.display()));
                    names.push(name.to_string());
                }
            }
        }
        names.sort();
        names
    }

    #[test]
    fn the_registry_is_every_kernel_in_the_source_by_name_and_each_builds() {
        let names: Vec<&str> = registry().iter().map(|k| k.name()).collect();
        assert_eq!(names, declared_in_source());
        for name in ["attention", "gemm", "softmax", "vector_add"] {
            assert!(find(name).is_some_and(|k| k.name() == name), "{name}");
        }
        assert!(find("nope").is_none());
        for k in registry() {
            if let Err(e) = k.build_defines(&[], true) {
                panic!("{} does not build with its defaults: {e}", k.name());
            }
        }
    }
}

/// What the kernels' unit tests share.
#[cfg(test)]
mod testing {
    use kiln::ir::dsl::{KernelDef, Spec};
    use kiln::ir::print::print_kernel;
    use kiln::ir::{Kernel, OpKind};

    /// `def` built with `comptime`, every tensor 16-byte aligned; the IR is printed, so
    /// `--nocapture` shows it. Panics with the diagnostic otherwise.
    pub(crate) fn build<K: KernelDef>(def: &K, comptime: K::Comptime) -> Kernel {
        let spec = Spec::uniform(comptime, def.signature(), true);
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

    /// How many `for`s `k` holds, at any depth.
    pub(crate) fn loop_count(k: &Kernel) -> usize {
        k.ops
            .iter()
            .filter(|(_, op)| matches!(op.kind, OpKind::For { .. }))
            .count()
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
