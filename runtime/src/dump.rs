//! `KILN_DUMP=ir,ptx`: writes what compilation produced for each kernel specialisation into
//! `KILN_DUMP_DIR` (default `kiln-dump/`), as `<kernel>.<spec-hash>.<pass>.ir` and
//! `<kernel>.<spec-hash>.ptx`.
//!
//! The spec hash covers the kernel name, [`Spec::key`] and the target, so files of different
//! specialisations never collide and the same specialisation always gets the same name.

use std::path::PathBuf;

use kiln_ir::dsl::{Comptime, Spec};
use kiln_ir::{Kernel, Target};

use crate::error::RuntimeError;

/// Which dumps are on, and where they go. Read once per [`crate::Device`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DumpConfig {
    /// Write the IR (`ir` in `KILN_DUMP`).
    pub ir: bool,
    /// Write the PTX (`ptx` in `KILN_DUMP`).
    pub ptx: bool,
    /// The directory files go to.
    pub dir: PathBuf,
}

impl DumpConfig {
    /// The configuration from `KILN_DUMP` and `KILN_DUMP_DIR`.
    pub fn from_env() -> DumpConfig {
        DumpConfig::parse(
            std::env::var("KILN_DUMP").ok().as_deref(),
            std::env::var("KILN_DUMP_DIR").ok().as_deref(),
        )
    }

    /// The configuration for a `KILN_DUMP` value (comma-separated `ir`, `ptx`; unknown words
    /// are ignored) and a `KILN_DUMP_DIR` value.
    pub fn parse(what: Option<&str>, dir: Option<&str>) -> DumpConfig {
        let words: Vec<&str> = what.unwrap_or("").split(',').map(str::trim).collect();
        DumpConfig {
            ir: words.contains(&"ir"),
            ptx: words.contains(&"ptx"),
            dir: PathBuf::from(dir.filter(|d| !d.is_empty()).unwrap_or("kiln-dump")),
        }
    }

    /// Writes the IR of `kernel` as it is after `pass` (`build` for the kernel as built).
    fn ir<C: Comptime>(
        &self,
        kernel: &Kernel,
        spec: &Spec<C>,
        target: Target,
        pass: &str,
    ) -> Result<(), RuntimeError> {
        if !self.ir {
            return Ok(());
        }
        let text = kiln_ir::print::print_kernel(kernel);
        self.write(
            &format!("{}.{pass}.ir", stem(&kernel.name, spec, target)),
            &text,
        )
    }

    /// Writes the IR of `kernel` as built (`build`) and after every pass of the pipeline for
    /// `target` (`<pass>`), by running the pipeline on a copy with an observer. A pass that
    /// fails stops the dump; `kiln_ptx::compile` then reports the same diagnostic.
    pub fn passes<C: Comptime>(
        &self,
        kernel: &Kernel,
        spec: &Spec<C>,
        target: Target,
    ) -> Result<(), RuntimeError> {
        if !self.ir {
            return Ok(());
        }
        self.ir(kernel, spec, target, "build")?;
        let mut copy = kernel.clone();
        let mut written = Ok(());
        let observe = &mut |pass: &str, k: &Kernel| {
            if written.is_ok() {
                written = self.ir(k, spec, target, pass);
            }
        };
        // A failing pass is reported by the compile that follows, at the user's source.
        let _ = kiln_ir::passes::run_pipeline(&mut copy, target, observe);
        written
    }

    /// Writes the PTX text of `kernel`.
    pub fn ptx<C: Comptime>(
        &self,
        kernel: &str,
        spec: &Spec<C>,
        target: Target,
        ptx: &str,
    ) -> Result<(), RuntimeError> {
        if !self.ptx {
            return Ok(());
        }
        self.write(&format!("{}.ptx", stem(kernel, spec, target)), ptx)
    }

    fn write(&self, file: &str, text: &str) -> Result<(), RuntimeError> {
        let path = self.dir.join(file);
        let err = |source| RuntimeError::Dump {
            path: path.display().to_string(),
            source,
        };
        std::fs::create_dir_all(&self.dir).map_err(err)?;
        std::fs::write(&path, text).map_err(err)
    }
}

/// `<kernel>.<spec-hash>`: the file stem of one specialisation.
pub fn stem<C: Comptime>(kernel: &str, spec: &Spec<C>, target: Target) -> String {
    format!("{kernel}.{:016x}", spec_hash(kernel, spec, target))
}

/// A stable 64-bit FNV-1a hash of the kernel name, spec key and target (stable across runs
/// and Rust versions, unlike `DefaultHasher`).
pub fn spec_hash<C: Comptime>(kernel: &str, spec: &Spec<C>, target: Target) -> u64 {
    let text = format!("{kernel}\0{}\0{target}", spec.key());
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_reads_words_and_defaults_the_dir() {
        let c = DumpConfig::parse(Some("ir, ptx"), None);
        assert!(c.ir && c.ptx);
        assert_eq!(c.dir, PathBuf::from("kiln-dump"));
        let c = DumpConfig::parse(Some("ptx"), Some("/tmp/x"));
        assert!(!c.ir && c.ptx);
        assert_eq!(c.dir, PathBuf::from("/tmp/x"));
        assert!(!DumpConfig::parse(None, None).ir);
    }

    #[test]
    fn hash_separates_specs_and_targets() {
        let a = Spec::new(()).with_aligned16(&["q"]);
        let b = Spec::new(());
        let h = |s: &Spec<()>, t| spec_hash("attention", s, t);
        assert_eq!(h(&a, Target::Sm80), h(&a.clone(), Target::Sm80));
        assert_ne!(h(&a, Target::Sm80), h(&b, Target::Sm80));
        assert_ne!(h(&a, Target::Sm80), h(&a, Target::Sm90a));
        assert!(stem("attention", &a, Target::Sm80).starts_with("attention."));
    }

    #[test]
    fn ptx_dump_writes_a_file_named_by_the_spec() {
        let dir = std::env::temp_dir().join(format!("kiln-dump-test-{}", std::process::id()));
        let c = DumpConfig::parse(Some("ptx"), dir.to_str());
        let spec = Spec::new(());
        c.ptx("k", &spec, Target::Sm90a, "// ptx").expect("writes");
        let file = dir.join(format!("{}.ptx", stem("k", &spec, Target::Sm90a)));
        assert_eq!(std::fs::read_to_string(&file).expect("exists"), "// ptx");
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn ir_dump_writes_the_built_kernel_and_every_pass() {
        let dir = std::env::temp_dir().join(format!("kiln-dump-ir-{}", std::process::id()));
        let c = DumpConfig::parse(Some("ir"), dir.to_str());
        let kernel = Kernel::new("empty", vec![], Default::default());
        let spec = Spec::new(());
        c.passes(&kernel, &spec, Target::Sm80).expect("writes");
        let stem = stem("empty", &spec, Target::Sm80);
        let passes = kiln_ir::passes::PASSES
            .iter()
            .map(|(name, _, _)| *name)
            .filter(|name| kiln_ir::passes::applies(name, Target::Sm80));
        for pass in std::iter::once("build").chain(passes) {
            let file = dir.join(format!("{stem}.{pass}.ir"));
            let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{file:?}: {e}"));
            assert!(text.contains("empty"), "{file:?}: {text}");
        }
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
