//! Every kernel linked into the program, without a hand-kept list: the code `#[kernel]`
//! generates submits each definition here at link time (through the `inventory` crate), so the
//! CLI library, the tests and a user's own tools reach the user's kernels exactly as they reach
//! the bundled examples ([`registered`] says which kernels a program sees).

use std::fmt;
use std::sync::OnceLock;

use super::def::AnyKernelDef;

/// One registered kernel: its definition, and the module that defines it (two kernels of one
/// name in different modules are told apart by their paths).
pub struct Registered {
    def: &'static dyn AnyKernelDef,
    module: &'static str,
}

impl Registered {
    /// The entry `#[kernel]` submits for `def`, defined in `module` (its `module_path!()`).
    /// Not meant to be called by hand: a kernel registers itself.
    #[doc(hidden)]
    pub const fn new(def: &'static dyn AnyKernelDef, module: &'static str) -> Registered {
        Registered { def, module }
    }

    /// The kernel definition, to build or list it.
    pub fn def(&self) -> &'static dyn AnyKernelDef {
        self.def
    }

    /// The kernel's name (its Rust function's).
    pub fn name(&self) -> &'static str {
        self.def.name()
    }

    /// The module defining the kernel, as `module_path!()` spells it
    /// (`kiln_examples::gemm`).
    pub fn module(&self) -> &'static str {
        self.module
    }

    /// The crate defining the kernel (the module path's first segment, `kiln_examples`).
    pub fn crate_name(&self) -> &'static str {
        self.module.split("::").next().unwrap_or(self.module)
    }

    /// The kernel's full path, `kiln_examples::gemm::gemm`.
    pub fn path(&self) -> String {
        format!("{}::{}", self.module, self.name())
    }
}

impl fmt::Debug for Registered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Registered({})", self.path())
    }
}

inventory::collect!(Registered);

/// Every kernel registered in this program, ordered by name, then by module path: the same
/// order on every run and every platform, whatever order the linker laid them in.
///
/// A kernel is registered when the object code defining it is linked into the program: a
/// binary sees the kernels of its own crate and of every library crate it uses (a library
/// linked only through `Cargo.toml`, never named in code, is not linked at all: name it, e.g.
/// `use my_kernels as _;`). Kernels under `#[cfg(test)]`, in integration tests and in doc
/// tests register in the test binaries that compile them.
pub fn registered() -> &'static [&'static Registered] {
    // The set is fixed once `main` runs (the entries are submitted before it), so it is
    // sorted once.
    static SORTED: OnceLock<Vec<&'static Registered>> = OnceLock::new();
    SORTED.get_or_init(|| {
        let mut all: Vec<&'static Registered> = inventory::iter::<Registered>().collect();
        all.sort_by(|a, b| (a.name(), a.module).cmp(&(b.name(), b.module)));
        all
    })
}

/// Why [`find`] found no single kernel.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FindError {
    /// No registered kernel has this name or path.
    #[error("no kernel named `{name}`; one of: {}", list_or_none(known))]
    NotFound {
        /// The name asked for.
        name: String,
        /// Every registered kernel's name (or path, where its name is not unique).
        known: Vec<String>,
    },
    /// Kernels in several modules share this name.
    #[error("{} kernels are named `{name}`; name one by its path: {}", paths.len(), paths.join(", "))]
    Ambiguous {
        /// The name asked for.
        name: String,
        /// The paths of the kernels of that name.
        paths: Vec<String>,
    },
}

/// `a, b, c`, or `none` for an empty list.
fn list_or_none(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    }
}

/// The kernel `name` among `kernels`: the one whose name it is, or, when it contains `::`,
/// the one whose path it is (how two kernels of one name are told apart).
pub fn find_in(
    kernels: &[&'static Registered],
    name: &str,
) -> Result<&'static Registered, FindError> {
    let hits: Vec<&'static Registered> = if name.contains("::") {
        kernels
            .iter()
            .copied()
            .filter(|k| k.path() == name)
            .collect()
    } else {
        kernels
            .iter()
            .copied()
            .filter(|k| k.name() == name)
            .collect()
    };
    match hits.as_slice() {
        [one] => Ok(one),
        [] => Err(FindError::NotFound {
            name: name.to_string(),
            known: display_names(kernels),
        }),
        many => Err(FindError::Ambiguous {
            name: name.to_string(),
            paths: many.iter().map(|k| k.path()).collect(),
        }),
    }
}

/// The registered kernel `name` (see [`find_in`]).
pub fn find(name: &str) -> Result<&'static Registered, FindError> {
    find_in(registered(), name)
}

/// How a listing names each of `kernels`: by name, or by path where another kernel shares
/// the name (what [`find_in`] accepts for it).
pub fn display_names(kernels: &[&'static Registered]) -> Vec<String> {
    kernels
        .iter()
        .map(|k| {
            let shared = kernels
                .iter()
                .filter(|o| o.name() == k.name())
                .nth(1)
                .is_some();
            if shared {
                k.path()
            } else {
                k.name().to_string()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dsl::{ComptimeParam, KernelDecl, KernelDef, ParamSig, Spec};
    use crate::{Diagnostic, Kernel};

    /// A definition that only has a name: what the lookups read.
    struct Named(&'static str);

    impl KernelDecl for Named {
        fn name(&self) -> &'static str {
            self.0
        }
        fn comptime_params(&self) -> &'static [ComptimeParam] {
            &[]
        }
        fn signature(&self) -> &'static [ParamSig] {
            &[]
        }
    }

    impl KernelDef for Named {
        type Comptime = ();
        fn build(&self, _: &Spec<()>) -> Result<Kernel, Diagnostic> {
            Err(Diagnostic::new(
                crate::Loc::default(),
                "a lookup test's kernel is never built",
            ))
        }
    }

    static A: Named = Named("relu");
    static B: Named = Named("relu");
    static C: Named = Named("scale");
    static RA: Registered = Registered::new(&A, "app::act");
    static RB: Registered = Registered::new(&B, "app::other");
    static RC: Registered = Registered::new(&C, "lib");

    #[test]
    fn a_unique_name_or_a_path_finds_its_kernel() {
        let all = [&RA, &RB, &RC];
        assert_eq!(
            find_in(&all, "scale").map(|k| k.path()),
            Ok("lib::scale".into())
        );
        assert_eq!(
            find_in(&all, "app::other::relu").map(|k| k.module()),
            Ok("app::other")
        );
        assert_eq!(RA.crate_name(), "app");
        assert_eq!(RC.crate_name(), "lib");
    }

    #[test]
    fn a_shared_name_asks_for_a_path_and_a_wrong_one_lists_the_kernels() {
        let all = [&RA, &RB, &RC];
        let err = find_in(&all, "relu").expect_err("two kernels");
        assert_eq!(
            err.to_string(),
            "2 kernels are named `relu`; name one by its path: app::act::relu, app::other::relu"
        );
        let err = find_in(&all, "gelu").expect_err("none");
        assert_eq!(
            err.to_string(),
            "no kernel named `gelu`; one of: app::act::relu, app::other::relu, scale"
        );
        let err = find_in(&[], "gelu").expect_err("none");
        assert_eq!(err.to_string(), "no kernel named `gelu`; one of: none");
    }
}
